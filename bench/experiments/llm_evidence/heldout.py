"""A model on a family's held-out prompts: the loss of every valid answer and graded samples.

* **Loss**: every valid answer of every held-out prompt scored with the training
  loss l_ij (token mean of the answer and its EOS, prompt masked), each
  distinct prompt run once (`mrt_fast.llm.prefix_loss.prefix_pair_losses`).
  A prompt's loss L_p is the mean of l_ij over its valid answers: the expected
  training loss under the uniform distribution on its answers, the target a
  multi-response model is trained towards.
* **Samples**: one greedy answer and ``n_samples`` samples (temperature 1, no
  top-k / top-p) per prompt, each prompt run once and its key-value cache
  repeated for its answers, each answer graded by the family's checker
  (``valid``, ``near_miss``, ``wrong``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from llm_evidence.families import VALID, Item


def answer_losses(net: Any, tok: Any, items: Sequence[Item], *, prompt_format: str, batch_size: int = 8) -> dict:
    """Per held-out prompt, the mean loss over its valid answers (``loss``), and every answer's loss and tokens."""
    from mrt_fast.llm.prefix_loss import prefix_pair_losses

    prompts = [it.prompt for it in items for _ in it.valid]
    answers = [a for it in items for a in it.valid]
    per, ns = prefix_pair_losses(net, tok, prompts, answers, prompt_format=prompt_format, batch_size=batch_size,
                                 return_counts=True)
    bounds = np.cumsum([0] + [len(it.valid) for it in items])
    loss = [float(per[a:b].mean()) for a, b in zip(bounds[:-1], bounds[1:])]
    return {"loss": loss, "answer_loss": per.tolist(), "answer_tokens": ns.tolist(),
            "n_answers": [len(it.valid) for it in items]}


def generate_answers(net: Any, tok: Any, prompts: Sequence[str], *, n_samples: int, max_new_tokens: int,
                     seed: int, prompt_format: str, batch_size: int = 16) -> tuple[list[str], list[list[str]]]:
    """One greedy answer and ``n_samples`` samples (temperature 1) per prompt, decoded without special tokens up
    to the first EOS. Each prompt runs once: its key-value cache is repeated for its 1 + n_samples answers."""
    import torch

    from mrt_fast.llm.loss import forward_takes
    from mrt_fast.llm.models import prompt_ids

    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos = tok.eos_token_id
    dev = next(net.parameters()).device
    cache_kw = "cache" if forward_takes(net, "cache") else "past_key_values"
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rows = 1 + n_samples
    greedy: list[str] = []
    samples: list[list[str]] = []
    with torch.inference_mode():
        for b0 in range(0, len(prompts), batch_size):
            ids = [prompt_ids(tok, p, prompt_format) for p in prompts[b0:b0 + batch_size]]
            width = max(len(x) for x in ids)
            x = torch.full((len(ids), width), pad, dtype=torch.long)
            mask = torch.zeros((len(ids), width), dtype=torch.long)
            for j, row in enumerate(ids):
                x[j, width - len(row):] = torch.tensor(row)
                mask[j, width - len(row):] = 1
            pos = (mask.cumsum(-1) - 1).clamp_min(0)
            out = net(input_ids=x.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev), use_cache=True,
                      logits_to_keep=1)
            cache = getattr(out, "cache", None) or out.past_key_values
            cache.batch_repeat_interleave(rows)
            logits = out.logits[:, -1].float().cpu().repeat_interleave(rows, 0)
            mask = mask.repeat_interleave(rows, 0)
            nxt_pos = mask.sum(-1)
            is_greedy = (torch.arange(len(mask)) % rows) == 0
            toks: list[list[int]] = [[] for _ in range(len(mask))]
            done = torch.zeros(len(mask), dtype=torch.bool)
            for _ in range(max_new_tokens):
                pick = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)[:, 0]
                pick = torch.where(is_greedy, logits.argmax(-1), pick)
                pick = torch.where(done, torch.full_like(pick, pad), pick)
                for r in torch.nonzero(~done)[:, 0].tolist():
                    if int(pick[r]) == eos:
                        done[r] = True
                    else:
                        toks[r].append(int(pick[r]))
                if bool(done.all()):
                    break
                mask = torch.cat([mask, torch.ones((len(mask), 1), dtype=torch.long)], 1)
                out = net(input_ids=pick[:, None].to(dev), attention_mask=mask.to(dev),
                          position_ids=nxt_pos[:, None].to(dev), use_cache=True, **{cache_kw: cache})
                cache = getattr(out, "cache", None) or out.past_key_values
                logits = out.logits[:, -1].float().cpu()
                nxt_pos = nxt_pos + 1
            texts = [tok.decode(t, skip_special_tokens=True) for t in toks]
            for j in range(len(ids)):
                greedy.append(texts[j * rows])
                samples.append(texts[j * rows + 1:(j + 1) * rows])
    return greedy, samples


def graded_samples(net: Any, tok: Any, items: Sequence[Item], *, n_samples: int, max_new_tokens: int, seed: int,
                   prompt_format: str) -> dict:
    """Greedy and sampled answers with their grades, and the valid rates (per prompt, then averaged)."""
    greedy, samples = generate_answers(net, tok, [it.prompt for it in items], n_samples=n_samples,
                                       max_new_tokens=max_new_tokens, seed=seed, prompt_format=prompt_format)
    g_grade = [it.grade(a) for it, a in zip(items, greedy)]
    s_grade = [[it.grade(a) for a in rs] for it, rs in zip(items, samples)]
    valid = [np.mean([g == VALID for g in gs]) for gs in s_grade]
    distinct = [len({a.strip() for a, g in zip(rs, gs) if g == VALID}) for rs, gs in zip(samples, s_grade)]
    return {"greedy": greedy, "greedy_grade": g_grade, "samples": samples, "sample_grade": s_grade,
            "greedy_valid_rate": float(np.mean([g == VALID for g in g_grade])),
            "sample_valid_rate": float(np.mean(valid)), "sample_valid_per_prompt": [float(v) for v in valid],
            "distinct_valid": float(np.mean(distinct))}


def evaluate_heldout(net: Any, tok: Any, items: Sequence[Item], *, prompt_format: str, n_samples: int,
                     max_new_tokens: int, seed: int, batch_size: int = 8) -> dict:
    """`answer_losses` and `graded_samples` of one model on ``items``, with their mean loss."""
    ev = answer_losses(net, tok, items, prompt_format=prompt_format, batch_size=batch_size)
    ev["mean_loss"] = float(np.mean(ev["loss"]))
    ev.update(graded_samples(net, tok, items, n_samples=n_samples, max_new_tokens=max_new_tokens, seed=seed,
                             prompt_format=prompt_format))
    ev["prompt_ids"] = [it.prompt_id for it in items]
    return ev
