"""A hub id's config.json, for a model the catalogue does not ship: a mirror of a base checkpoint under another
organisation, an instruct or dated variant, a fine-tune.

Looked up in the local Hugging Face cache first (huggingface_hub's own cache API, `try_to_load_from_cache`: no
network), then, only where downloading is allowed, fetched from the Hub (`hf_hub_download` of `config.json` alone,
into that same cache). Downloading is off by default: notebooks and tests never download. The command line turns it
on (`allow_downloads`) unless `--offline` or `HF_HUB_OFFLINE=1`, and says where each config came from (`origin`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlparse

from helpers.errors import InputError

_state = threading.local()
_origins: dict[str, str] = {}


def allow_downloads(on: bool = True, why_not: str | None = None) -> None:
    """Let `config_file` fetch a config.json from the Hub when the cache has none (the command line does); `why_not`:
    what forbids it when off (the command line's --offline), for the refusal to name."""
    _state.download, _state.why_not = on, why_not


def why_no_download() -> str:
    """Why a config is not downloaded now, as the end of a sentence."""
    if offline():
        return "HF_HUB_OFFLINE forbids a download"
    return getattr(_state, "why_not", None) or "nothing is downloaded here (the command line fetches a config.json " \
                                                "when online)"


def downloads_allowed() -> bool:
    return getattr(_state, "download", False) and not offline()


def offline() -> bool:
    """HF_HUB_OFFLINE set to a true value (huggingface_hub's own switch), read when asked."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def cache_dir() -> str:
    """The hub cache huggingface_hub uses: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub (read when
    asked, so that a changed environment is honoured)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def origin(repo_id: str) -> str | None:
    """Where the config of `repo_id` was found in this process ('the Hugging Face cache (PATH)' or the Hub's address
    with 'downloaded now'), None if it was not looked up here."""
    return _origins.get(repo_id.lower())


def cached_config(repo_id: str) -> Path | None:
    """The cached config.json of `repo_id` (its main revision), or None. No network."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir())
    except Exception:           # an id huggingface_hub rejects (its validators): not in any cache
        return None
    if isinstance(found, str) and Path(found).is_file():
        _origins[repo_id.lower()] = f"the Hugging Face cache ({found})"
        return Path(found)
    return None


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT") or "https://huggingface.co"


def _reachable(timeout: float = 3.0) -> bool:
    """A TCP connection to the Hub's endpoint opens within `timeout` seconds (else huggingface_hub would retry for
    about 20 s before failing)."""
    url = urlparse(_endpoint())
    try:
        with socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout):
            return True
    except OSError:
        return False


def download_config(repo_id: str) -> Path:
    """Fetch `repo_id`'s config.json alone into the cache; one-line InputError when it cannot be had."""
    from huggingface_hub import errors as hf_errors
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import logging as hf_logging

    instead = "download that model's config.json and pass its path (--model path/to/config.json)"
    if not _reachable():
        raise InputError(f"hub id {repo_id!r} is not in the catalogue nor in the Hugging Face cache "
                         f"({cache_dir()}), and the Hub ({_endpoint()}) cannot be reached from here: {instead}")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()            # (its retry notices)
    try:
        path = hf_hub_download(repo_id, "config.json", cache_dir=cache_dir())
    except hf_errors.GatedRepoError:
        raise InputError(f"hub id {repo_id!r} is gated: accept its licence on the Hub and log in (`hf auth login`), "
                         f"or {instead}") from None
    except hf_errors.RepositoryNotFoundError:
        raise InputError(f"hub id {repo_id!r}: no such model on the Hub ({_endpoint()}), or it is private: check the "
                         f"id, or {instead}") from None
    except hf_errors.LocalEntryNotFoundError:      # (an EntryNotFoundError too: the Hub did not answer)
        raise InputError(f"hub id {repo_id!r} is not in the catalogue nor in the Hugging Face cache "
                         f"({cache_dir()}), and the Hub ({_endpoint()}) did not answer: {instead}") from None
    except hf_errors.EntryNotFoundError:
        raise InputError(f"hub id {repo_id!r} has no config.json (a GGUF, adapter-only or non-transformers "
                         f"repository?): give the base model's id, or {instead}") from None
    except (hf_errors.HfHubHTTPError, OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"hub id {repo_id!r}: its config.json could not be downloaded ({first[:160]}): "
                         f"{instead}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    _origins[repo_id.lower()] = f"{_endpoint()} (downloaded now, config.json alone, into the cache: {path})"
    return Path(path)


def config_file(repo_id: str) -> Path | None:
    """`repo_id`'s config.json from the cache, else downloaded where allowed; None when neither (the caller says
    so in its own terms)."""
    found = cached_config(repo_id)
    if found is not None:
        return found
    if downloads_allowed():
        return download_config(repo_id)
    return None


@contextlib.contextmanager
def downloads(on: bool, why_not: str | None = None):
    """`allow_downloads(on, why_not)` for the duration of a block."""
    before = getattr(_state, "download", False), getattr(_state, "why_not", None)
    allow_downloads(on, why_not)
    try:
        yield
    finally:
        allow_downloads(*before)
