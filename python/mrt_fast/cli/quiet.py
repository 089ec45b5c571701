"""What other libraries print during an ``mrt`` command, kept out of its output.

The commands show their own progress (the job's bar, ``mrt run``'s stage lines);
the progress bars of Hugging Face's libraries (transformers, datasets, the hub's
downloads) and their advisory log lines and ``FutureWarning`` s are not the
user's to act on, and fill logs. An environment variable the user set wins.
"""

from __future__ import annotations

import os
import sys
import warnings

#: the libraries whose FutureWarnings an mrt command leaves out (mrt_fast issues none of its own:
#: a library's warning raised with a stack level lands on its mrt_fast caller)
LIBRARIES = ("transformers", "datasets", "sentence_transformers", "huggingface_hub", "peft", "accelerate", "torch",
             "tokenizers", "mrt_fast")
ENVIRONMENT = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
               "TRANSFORMERS_VERBOSITY": "error", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
               "TOKENIZERS_PARALLELISM": "false"}


def quiet_libraries() -> None:
    """Turn off the libraries' progress bars and advisory output: through the environment for
    those not imported yet, through their own switches for those already imported."""
    for k, v in ENVIRONMENT.items():
        os.environ.setdefault(k, v)
    warnings.filterwarnings("ignore", category=FutureWarning, module=rf"({'|'.join(LIBRARIES)})(\..*)?$")
    if sys.modules.get("transformers") is not None:  # None: the name is marked absent
        from transformers.utils import logging as tlog

        tlog.disable_progress_bar()
        tlog.set_verbosity_error()
    if sys.modules.get("datasets") is not None:
        import datasets

        datasets.disable_progress_bars()
        datasets.utils.logging.set_verbosity_error()
    if sys.modules.get("huggingface_hub") is not None:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
