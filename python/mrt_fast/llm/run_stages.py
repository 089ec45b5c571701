"""The embed, score and select steps of ``mrt run`` as stages of the dataset job.

Each step runs through the functions the dataset commands use
(:func:`mrt_fast.llm.dataset_stages.run_text_stage` and
:func:`~mrt_fast.llm.dataset_stages.score_dataset`, as ``mrt embed``,
``mrt score`` and ``mrt nll``; :func:`mrt_fast.datasets.select_job.select_dataset`,
as ``mrt select``), on either engine (``"local"`` or ``"ray"``).

Embed, score and the advisor's pilot losses (``nll``) write a resumable directory of
parts beside their file (``embedded.parquet.parts/``, ``scored.parquet.parts/``,
``diagnose/losses.parquet.parts/``: parts of
``rows_per_part`` consecutive candidates and the job's manifest); a run that
stopped resumes with the parts still missing. Once every part is there they are
gathered into the file (``embedded.parquet``, ``scored.parquet``) and the
directory is removed. A selection writes its cell's file whole or not at all.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import polars as pl

from mrt_fast.datasets.formats import read_table, write_table
from mrt_fast.datasets.stage import RowStage

__all__ = ["EmbedderRows", "HookRows", "embed_step", "nll_step", "parts_dir", "score_step", "select_step"]

#: rows of a part of the embed and score jobs of mrt run
ROWS_PER_PART = 50_000


def parts_dir(f: str | Path) -> Path:
    """The directory of parts a file of the run is made through (``<file>.parts``)."""
    f = Path(f)
    return f.with_name(f.name + ".parts")


def _parted(f: Path, go: Callable[[Path], Any], then: Callable[[pl.DataFrame], pl.DataFrame] | None = None) -> None:
    """Make ``f`` through its directory of parts: ``go(parts)`` runs the job into it (or resumes
    it; a finished one is left as it is), then the parts are gathered (and ``then`` applied) into
    ``f``, written atomically, and the directory removed."""
    from mrt_fast.embeddings.dataset import read_dataset

    d = parts_dir(f)
    d.mkdir(parents=True, exist_ok=True)  # an existing directory is a directory output, whatever its name
    go(d)
    df = read_dataset(d)
    write_table(df if then is None else then(df), f)
    shutil.rmtree(d)


class EmbedderRows(RowStage):
    """The embed stage of mrt run (:mod:`mrt_fast.datasets.stage`): each response embedded by the
    config's embedder (``make_embedder(spec)``, or ``embedder`` itself, or ``loader()`` on this
    machine), a null response as the empty text, into an ``embedding`` column
    (``Array(Float32, d)``)."""

    name, loads = "embed", "the embedder"

    def __init__(self, spec: str | None, embedder: Any = None, loader: Callable[[], Any] | None = None):
        self.spec, self.embedder, self.loader = spec, embedder, loader

    def __getstate__(self) -> dict:
        return {**self.__dict__, "loader": None}  # a worker elsewhere makes its own embedder

    def open(self, tick: Callable[[int], None] | None = None) -> Callable[[pl.DataFrame], pl.DataFrame]:
        from mrt_fast.embeddings.embedders import make_embedder

        emb = self.embedder if self.embedder is not None else \
            self.loader() if self.loader is not None else make_embedder(self.spec)

        def part(df: pl.DataFrame) -> pl.DataFrame:
            e = np.asarray(emb(df["response"].fill_null("").to_list()), dtype=np.float32)
            return df.with_columns(pl.Series("embedding", e).cast(pl.Array(pl.Float32, e.shape[1])))

        return part


class HookRows(RowStage):
    """The score stage of mrt run with a reward hook (:mod:`mrt_fast.datasets.stage`): the hook
    called on the rows of a part (prompt_id, prompt, response and the train prompts' other
    columns, joined by prompt id), its floats the ``reward`` column. ``hook``: the loaded hook,
    or None to load ``spec`` (``"package.module:function"``, ``"builtin:..."`` with the embedder
    ``embedder_spec``) where the stage opens."""

    name = "score"

    def __init__(self, hook: Any, spec: Any, prompts: str | None, embedder_spec: str | None = None):
        self.hook, self.spec, self.prompts, self.embedder_spec = hook, spec, prompts, embedder_spec

    def open(self, tick: Callable[[int], None] | None = None) -> Callable[[pl.DataFrame], pl.DataFrame]:
        from mrt_fast.llm.reward import load_reward_fn, score_with

        hook = self.hook
        if hook is None:
            from mrt_fast.embeddings.embedders import make_embedder

            builtin = isinstance(self.spec, str) and self.spec.startswith("builtin:")
            hook = load_reward_fn(self.spec, make_embedder(self.embedder_spec)) if builtin else \
                load_reward_fn(self.spec)
        prompts = read_table(self.prompts) if self.prompts is not None else None

        def part(df: pl.DataFrame) -> pl.DataFrame:
            rows = df.select("prompt_id", "prompt", "response")
            if prompts is not None:
                extra = [c for c in prompts.columns if c not in df.columns or c == "prompt_id"]
                if len(extra) > 1:
                    rows = rows.join(prompts.select(extra).with_columns(pl.col("prompt_id").cast(df["prompt_id"].dtype)),
                                     on="prompt_id", how="left", maintain_order="left")
            return df.with_columns(score_with(rows, hook)["reward"])

        return part


def embed_step(cand: Path, embedded: Path, *, spec: str | None, embedder: Any, loader: Callable[[], Any],
               embedder_id: str, engine: str = "local", rows_per_part: int = ROWS_PER_PART,
               progress: bool = False) -> None:
    """``embedded`` (the candidates with their embeddings) from ``cand``, through the embed job."""
    from mrt_fast.llm.dataset_stages import run_text_stage

    stage = EmbedderRows(spec, embedder, loader if engine == "local" else None)
    _parted(embedded, lambda d: run_text_stage(
        str(cand), d, name="embed", columns=("response",), out_column="embedding",
        parameters={"embedder": embedder_id}, make_stage=stage, rows_per_part=rows_per_part, engine=engine,
        progress=progress, layout="flat"))


def score_step(embedded: Path, scored: Path, *, reward_model: str | None, hook: Any, hook_spec: Any,
               hook_id: Any, prompts: str | None, embedder_spec: str | None, device: str,
               then: Callable[[pl.DataFrame], pl.DataFrame] | None, engine: str = "local",
               rows_per_part: int = ROWS_PER_PART, progress: bool = False) -> None:
    """``scored`` from ``embedded``: the rewards of the reward model or of the hook, through the
    score job (``then``: what is done to the whole table after, the answers); without either,
    ``then`` alone."""
    from mrt_fast.llm.dataset_stages import run_text_stage, score_dataset

    if reward_model:
        _parted(scored, lambda d: score_dataset(str(embedded), d, reward_model, device=device, layout="flat",
                                                rows_per_part=rows_per_part, engine=engine, progress=progress), then)
    elif hook is not None:
        # a hook named by a string is loaded again where the stage runs on Ray; a callable travels as it is
        ship = None if engine != "local" and isinstance(hook_spec, str) else hook
        stage = HookRows(ship, hook_spec, prompts, embedder_spec)
        _parted(scored, lambda d: run_text_stage(
            str(embedded), d, name="score", columns=("prompt", "response"), out_column="reward",
            parameters={"reward_fn": hook_id}, make_stage=stage, rows_per_part=rows_per_part, engine=engine,
            progress=progress, layout="flat"), then)
    else:
        df = pl.read_parquet(embedded)
        write_table(df if then is None else then(df), scored)


def nll_step(pairs: Path, losses: Path, *, model: str, adapter: Path | None, prompt_format: str,
             max_length: int | None, device: str, dtype: str = "float32", batch_size: int = 8,
             engine: str = "local", rows_per_part: int = ROWS_PER_PART, progress: bool = False) -> None:
    """``losses`` (prompt_id, loss) from the ``pairs`` file (prompt_id, prompt, response): each
    response's loss under ``model`` (with the LoRA ``adapter``, if any), through the nll job
    (``mrt nll``), in the pairs' order."""
    from mrt_fast.llm.dataset_stages import nll_dataset
    from mrt_fast.llm.models import load_causal_lm, load_tokenizer

    def loader():
        return load_causal_lm(model, device=device, dtype=dtype, adapter=adapter), load_tokenizer(model)

    loader.model_id = str(model) if adapter is None else f"{model} (adapter {adapter})"
    _parted(losses, lambda d: nll_dataset(
        str(pairs), d, loader=loader, batch_size=batch_size, max_length=max_length, prompt_format=prompt_format,
        device=device, layout="flat", rows_per_part=rows_per_part, engine=engine, progress=progress),
        lambda df: df.select("prompt_id", "loss"))


def select_step(scored: Path, kept: Path, k: int, method: str, sel_kw: dict, *, engine: str = "local") -> None:
    """The kept rows of one cell (``k``, canonical ``method``, the config's selection keywords)
    from the scored candidates, through the select job; the file is written whole or not at all."""
    from mrt_fast.datasets.select_job import select_dataset

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        select_dataset(str(scored), kept, k, method, engine=engine, command=f"mrt run: select {kept.stem}",
                       **sel_kw)
