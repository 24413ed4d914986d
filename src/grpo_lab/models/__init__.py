"""The policy model and its tokenizer: where a `model.name_or_path` comes from, and loading it.

Owns: resolving a model's source (a builtin tiny model built in code, a package's, a local folder, the Hub) and
loading it with the dtype, attention and chat template the config names (``loading.py``), and whether the Hub can
be reached at all (``hub.py``: offline, a clear error in seconds). May import: ``grpo_lab.config`` and the basic
modules; torch, transformers and peft inside the functions that need them.
"""

from grpo_lab.models.loading import (
    BUILTIN_PREFIX,
    BUILTINS,
    CHATML_TEMPLATE,
    OFFLINE_HINT,
    PACKAGE_PREFIX,
    ModelSource,
    SourceKind,
    architecture,
    check_available,
    count_parameters,
    in_hf_cache,
    load_model_and_tokenizer,
    prepare,
    resolve_source,
    served_path,
)

__all__ = [
    "BUILTINS",
    "BUILTIN_PREFIX",
    "CHATML_TEMPLATE",
    "OFFLINE_HINT",
    "PACKAGE_PREFIX",
    "ModelSource",
    "SourceKind",
    "architecture",
    "check_available",
    "count_parameters",
    "in_hf_cache",
    "load_model_and_tokenizer",
    "prepare",
    "resolve_source",
    "served_path",
]
