"""Hydra discovers this package (the `hydra_plugins` namespace): the user's config folders go before grpo_lab's.

It acts only on grpo_lab's own search path (the one whose primary folder is grpo_lab's `conf/`); see
`grpo_lab.paths.arrange_search_path` for the order. Import-light: only `grpo_lab.paths`.
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class GrpoLabSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from grpo_lab.paths import arrange_search_path

        arrange_search_path(search_path)
