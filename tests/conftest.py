import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import faulthandler
import importlib.util
import sys
from pathlib import Path

import pytest

# A fatal signal in native code (a segfault in a library's thread) prints every thread's Python
# stack on stdout, where a CI log that keeps only stdout still shows it (run with -p no:faulthandler,
# as `make test` does, so that pytest's own handler on stderr does not replace this one).
faulthandler.enable(file=sys.__stdout__, all_threads=True)

# The folder tests/datasets is on sys.path's tests/ as a namespace package named `datasets`.
# Where Hugging Face `datasets` is not installed, transformers would find that folder, take it for
# the library and fail on `datasets.Dataset`: the name is marked absent instead.
_spec = importlib.util.find_spec("datasets")
if _spec is not None and _spec.origin is None and any(
        Path(p).resolve() == Path(__file__).resolve().parent / "datasets" for p in _spec.submodule_search_locations or ()):
    sys.modules["datasets"] = None


def _has(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


def pytest_collection_modifyitems(config, items):
    """Skip marked tests whose optional stack is missing (never silently pass)."""
    needs = {"torch": ["torch"], "train": ["torch", "transformers", "peft"], "embed": ["sentence_transformers", "faiss"],
             "int8": ["onnxruntime", "onnx", "torch", "transformers"], "ray": ["ray"]}
    gpu = False
    if _has("torch"):
        try:
            import torch

            gpu = torch.cuda.is_available()
        except Exception:  # noqa: BLE001  (a broken CUDA set-up raises anything: no GPU then)
            gpu = False
    for item in items:
        for mark, mods in needs.items():
            if item.get_closest_marker(mark) and not all(_has(m) for m in mods):
                item.add_marker(pytest.mark.skip(reason=f"needs the {mark!r} extra"))
        if item.get_closest_marker("gpu") and not gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


@pytest.fixture(scope="module", autouse=True)
def _no_ray_left_running():
    """A Ray instance a test module started (the engine starts one on first use) ends with the
    module: the next module's tests start their own, with their own settings."""
    import sys

    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance of 2 CPUs for a module's tests, Ray Data's progress bars and banners off."""
    import logging

    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_source(tmp_path_factory):
    """A one-layer BERT (random, seeded) with the bundled MiniLM tokenizer: a model source that builds in seconds."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    from mrt_fast.embeddings.tiers import minilm_path

    d = tmp_path_factory.mktemp("tiny_bert")
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    BertModel(cfg).save_pretrained(d)
    shutil.copy(minilm_path() / "tokenizer.json", d / "tokenizer.json")
    return d


#: the environment variables an S3 client reads its endpoint and credentials from
S3_ENV = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")


@pytest.fixture(scope="module")
def s3_endpoint():
    """A moto S3 server on 127.0.0.1 for one test module, and the environment pointed at it
    (restored afterwards). Skips where moto or boto3 is missing."""
    import logging

    moto_server = pytest.importorskip("moto.server")
    pytest.importorskip("boto3")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    old = {k: os.environ.get(k) for k in S3_ENV}
    os.environ.update(AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_ACCESS_KEY_ID="testing",
                      AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1")
    try:
        yield os.environ["AWS_ENDPOINT_URL"]
    finally:
        srv.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_s3_buckets = iter(range(10**6))


@pytest.fixture
def s3_bucket(s3_endpoint):
    """A new, empty bucket on the module's moto server: ``s3://NAME``."""
    import boto3

    name = f"mrt-test-{next(_s3_buckets)}"
    boto3.client("s3").create_bucket(Bucket=name)
    return f"s3://{name}"
