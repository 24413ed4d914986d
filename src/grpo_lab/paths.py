"""Where grpo_lab's files live: the shipped configs, the user's own config folders, and the model cache.

The shipped `conf/` and `sweeps/` are top-level folders of the repository. The wheel carries them inside the
package (`grpo_lab/conf`, `grpo_lab/sweeps`, see pyproject.toml); an editable install reads them from the
checkout. A user's folders come first on Hydra's search path (first match wins), so a file of theirs replaces
ours of the same name and a new name adds an option:

1. `--config-dir DIR` (Hydra's flag);
2. `$GRPO_LAB_CONFIG` (one folder, laid out like `conf/`);
3. grpo_lab's own `conf/`, and its `sweeps/` as the `sweep` group (kept in Hydra's ConfigStore).

Sweeps: a `sweep/NAME.yaml` in a user's folder adds one; Hydra refuses a file with the name of a ConfigStore
entry (automatic schema matching), so one of ours is replaced from `$GRPO_LAB_CONFIG/sweeps/NAME.yaml`, which
is stored in the ConfigStore in its place. `hydra.searchpath` entries come after ours: they only add options.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_lab.errors import ConfigError

if TYPE_CHECKING:
    from hydra.core.config_search_path import ConfigSearchPath

_PACKAGE = Path(__file__).resolve().parent

# A folder of the user's own configs (conf/-style groups, optionally sweeps/), searched before ours.
CONFIG_ENV = "GRPO_LAB_CONFIG"


def _shipped(name: str) -> Path:
    """`grpo_lab/<name>` inside an installed wheel, else `<checkout>/<name>` of an editable install."""
    installed = _PACKAGE / name
    if installed.is_dir():
        return installed
    checkout = _PACKAGE.parents[1]  # <checkout>/src/grpo_lab
    if _PACKAGE.parent.name == "src" and (checkout / "pyproject.toml").is_file() and (checkout / name).is_dir():
        return checkout / name
    raise ImportError(
        f"grpo_lab's `{name}/` folder is missing: not in {installed} (a wheel) nor in a checkout around {_PACKAGE}. "
        "Reinstall grpo-lab."
    )


CONF_DIR = _shipped("conf")
SWEEPS_DIR = _shipped("sweeps")


def user_config_dir(*, strict: bool = True) -> Path | None:
    """`$GRPO_LAB_CONFIG` as an absolute folder (relative to the current directory), or None when unset.

    A value that is not a folder raises ConfigError (`strict=False`: None, for code that runs at import)."""
    value = os.environ.get(CONFIG_ENV, "").strip()
    if not value:
        return None
    path = Path(value).expanduser().resolve()
    if not path.is_dir():
        if not strict:
            return None
        raise ConfigError(f"{CONFIG_ENV}={value}: no such folder (it should hold your conf/-style groups).")
    return path


def config_dirs(extra: Iterable[Path] = ()) -> list[Path]:
    """The config folders, first match wins: `extra` (e.g. `--config-dir`), `$GRPO_LAB_CONFIG`, ours."""
    dirs = [Path(d).resolve() for d in extra]
    if (user := user_config_dir()) is not None:
        dirs.append(user)
    dirs.append(CONF_DIR)
    return list(dict.fromkeys(dirs))


def config_groups(extra: Iterable[Path] = ()) -> set[str]:
    """Config group names: the folders of every config folder, plus `sweep` (our sweeps/ is registered as that)."""
    return {p.name for d in config_dirs(extra) if d.is_dir() for p in d.iterdir() if p.is_dir()} | {"sweep"}


def sweep_files() -> list[Path]:
    """The sweep definitions kept in Hydra's ConfigStore, later ones replacing earlier ones of the same name:
    ours, then `$GRPO_LAB_CONFIG/sweeps/*.yaml` (a user's `sweep/` folder is on the search path already)."""
    folders = [SWEEPS_DIR]
    if (user := user_config_dir(strict=False)) is not None:
        folders.append(user / "sweeps")
    return [path for folder in folders for path in sorted(folder.glob("*.yaml"))]


def export_dir() -> Path:
    """Where `compare --export` writes presets: `$GRPO_LAB_CONFIG`, else `./conf` (never the installed package)."""
    return user_config_dir() or Path.cwd() / "conf"


def on_search_path(folder: Path) -> bool:
    """Whether presets in `folder` are found without `--config-dir` (it is `$GRPO_LAB_CONFIG` or ours)."""
    return folder.resolve() in config_dirs()


def arrange_search_path(search_path: ConfigSearchPath) -> None:
    """Put the user's folders before ours on grpo_lab's Hydra search path (called by our SearchPathPlugin).

    Hydra builds `hydra, main (ours), plugins..., schema (ConfigStore)` and inserts `--config-dir` just before
    the first `schema` entry, i.e. after ours. Moving ours (and `$GRPO_LAB_CONFIG`) behind a ConfigStore entry
    lets `--config-dir` land first; the ConfigStore holds no file of ours (only Hydra's and plugins' schemas and
    our sweeps, which a user's `sweep/NAME.yaml` then overrides). Another Hydra app's search path is left as is.
    """
    elements = search_path.get_path()
    ours = [i for i, e in enumerate(elements) if e.provider == "main" and _as_dir(e.path) == CONF_DIR]
    if not ours:
        return
    main = elements.pop(ours[0])
    search_path.append("schema", "structured://")
    if (user := user_config_dir()) is not None and user != CONF_DIR:
        search_path.append(CONFIG_ENV, f"file://{user}")
    search_path.append(main.provider, main.path)


def _as_dir(path: str | None) -> Path | None:
    """A search path entry's folder (`file://DIR` or a plain path); None for `pkg://`, `structured://` ..."""
    if not path:
        return None
    if path.startswith("file://"):
        path = path.removeprefix("file://")
    elif "://" in path:
        return None
    return Path(path).resolve()


def cache_dir() -> Path:
    """`$GRPO_LAB_CACHE`, else `$XDG_CACHE_HOME/grpo_lab`, else `~/.cache/grpo_lab`."""
    if explicit := os.environ.get("GRPO_LAB_CACHE"):
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "grpo_lab"


# A sweep's folder, <sweep_root>/<study>/: each trial's run folder (also its W&B run's name) and the best trial(s).
BEST_FILE = "best.yaml"
# In a sweep's folder: which study its trials belong to, and the command that continues it (grpo_lab.sweep.identity).
STUDY_FILE = "study.json"


def trial_name(number: int) -> str:
    return f"trial_{number}"
