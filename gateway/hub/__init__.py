"""Downloads from the Hugging Face hub for the gateway's runtime loads (/load_sentence_transformer_model,
/load_clip_model), bounded and explained (docs/hub-downloads.md), in three steps:
options.py (may this load download: HUB_DOWNLOADS), plan.py (which files, from the hub's metadata, within
HUB_MAX_DOWNLOAD_BYTES), download.py (a child process, child.py, fetches them into the cache); explain.py
turns a hub failure into the error that says why."""
from gateway.hub.download import completed, hub_folder, snapshot_folder, stop_downloads
from gateway.hub.options import HUB_ID, HubOptions, check_allowed, default_downloads, parse_downloads
from gateway.hub.plan import Plan, plan_download, select_files

__all__ = ["HUB_ID", "HubOptions", "Plan", "check_allowed", "completed", "default_downloads", "hub_folder",
           "parse_downloads", "plan_download", "select_files", "snapshot_folder", "stop_downloads"]
