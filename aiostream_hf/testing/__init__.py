"""Testing tools: a local Hub-compatible server and synthetic dataset makers.

from aiostream_hf.testing import HubServer, make_repo_split_naming

make_repo_split_naming(root)
with HubServer(root) as hub:
    ...  # point HF_ENDPOINT (or endpoint=) at hub.endpoint

The makers need nothing beyond the runtime install; the server runs under uvicorn,
which the ``server`` extra brings (``pip install 'aiostream-hf[server]'``, also in
``test``). Without it, importing this module works and starting a server raises
``HubServerError`` naming the extra.
"""

from ._datasets import make_image_parquet as make_image_parquet
from ._datasets import make_repo as make_repo
from ._datasets import make_repo_split_folders as make_repo_split_folders
from ._datasets import make_repo_split_naming as make_repo_split_naming
from ._datasets import make_repo_yaml_configs as make_repo_yaml_configs
from ._datasets import make_text_parquet as make_text_parquet
from ._datasets import make_webdataset_shards as make_webdataset_shards
from ._faults import Faults as Faults
from ._faults import RateLimits as RateLimits
from ._hub_app import HubStats as HubStats
from ._hub_server import HubServer as HubServer
from ._lerobot import LeRobotEpisode as LeRobotEpisode
from ._lerobot import LeRobotLayout as LeRobotLayout
from ._lerobot import LeRobotVideoSpan as LeRobotVideoSpan
from ._lerobot import lerobot_frame as lerobot_frame
from ._lerobot import make_lerobot_dataset as make_lerobot_dataset
from ._lerobot import make_video as make_video

__all__ = [
    "Faults",
    "HubServer",
    "HubStats",
    "LeRobotEpisode",
    "LeRobotLayout",
    "LeRobotVideoSpan",
    "RateLimits",
    "lerobot_frame",
    "make_image_parquet",
    "make_lerobot_dataset",
    "make_repo",
    "make_repo_split_folders",
    "make_repo_split_naming",
    "make_repo_yaml_configs",
    "make_text_parquet",
    "make_video",
    "make_webdataset_shards",
]
