"""A model named by a hub id the catalogue does not ship (a mirror, a variant, a fine-tune): its config.json from the
local Hugging Face cache (huggingface_hub's own cache layout and API), or downloaded by the command line where it may
(here the download is replaced: tests never download). The output says where the config came from and which
catalogue model has the same parameters; what cannot be had is one line naming why."""

import json
from pathlib import Path

import huggingface_hub
import pytest

from helpers import estimate, hub, models
from helpers.__main__ import main
from helpers.errors import InputError
from helpers.readers import read

MIRROR = "NousResearch/Llama-3.2-1B"


def cache_config(root, repo_id: str, config: dict, revision: str = "0123abcd") -> None:
    """`repo_id`'s config.json laid out as huggingface_hub's cache keeps it: refs/main names the revision, whose
    snapshots/REV/config.json is a link to the content under blobs/ (a name without .json)."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    (repo / "blobs").mkdir()
    (repo / "blobs" / "e3b0c44298fc1c14").write_text(json.dumps(config))     # its content, named by hash
    (repo / "snapshots" / revision).mkdir(parents=True)
    (repo / "snapshots" / revision / "config.json").symlink_to(Path("../../blobs/e3b0c44298fc1c14"))


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache of our own, and any download attempt a failure of the test."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def no_download(*a, **k):
        raise AssertionError("a test tried to download")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_download)
    return tmp_path / "hub"


def llama_1b() -> dict:
    return json.loads(models.config_path("llama-3.2-1b").read_text())


def test_a_cached_mirror_is_read_with_its_own_name(hf_cache):
    cache_config(hf_cache, MIRROR, llama_1b())
    m = models.spec(MIRROR)
    assert m.name == MIRROR and m.params == models.spec("llama-3.2-1b").params
    assert models.same_shapes_as(MIRROR) == "llama-3.2-1b"
    assert "the Hugging Face cache" in hub.origin(MIRROR)
    assert estimate.run(MIRROR, models_setup()).gpu.peak_bytes == estimate.run("llama-3.2-1b", models_setup()).gpu.peak_bytes


def models_setup():
    from helpers.training import TrainSetup

    return TrainSetup(lora_rank=8, seq=512)


def test_a_variant_with_other_shapes_names_no_catalogue_model(hf_cache):
    cfg = llama_1b() | {"num_hidden_layers": 12}
    cache_config(hf_cache, "someone/llama-1b-pruned", cfg)
    assert models.same_shapes_as("someone/llama-1b-pruned") is None
    assert models.spec("someone/llama-1b-pruned").layers == 12


def test_the_cli_says_where_the_config_came_from(hf_cache, capsys):
    cache_config(hf_cache, MIRROR, llama_1b())
    assert main(["estimate", "--model", MIRROR, "--lora-rank", "8"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"model {MIRROR}: config.json from the Hugging Face cache (")
    assert first.endswith("the same parameters as catalogue model llama-3.2-1b")
    assert main(["fixes", "--model", MIRROR, "--lora-rank", "8", "--gpu-gib", "2", "--json"]) == 0
    src = json.loads(capsys.readouterr().out)["model_source"]
    assert src["hub_id"] == MIRROR and src["same_shapes_as"] == "llama-3.2-1b"


def test_a_config_file_naming_a_cached_mirror_is_read(hf_cache, tmp_path):
    cache_config(hf_cache, MIRROR, llama_1b())
    (tmp_path / "t.yaml").write_text(f"model_name_or_path: {MIRROR}\nuse_peft: true\n")
    imp = read([tmp_path / "t.yaml"])
    assert imp.model is not None and models.spec(imp.model).name == MIRROR


def test_nothing_is_downloaded_outside_the_command_line(hf_cache):
    with pytest.raises(InputError) as err:
        models.spec("Qwen/Qwen3-4B-Instruct-2507")
    msg = str(err.value)
    assert "nor in the Hugging Face cache" in msg and "nothing is downloaded here" in msg and "\n" not in msg


@pytest.mark.parametrize("how,needle", [(["--offline"], "--offline forbids a download"),
                                        ([], "HF_HUB_OFFLINE forbids a download")])
def test_offline_refusals_are_one_line(hf_cache, monkeypatch, capsys, how, needle):
    if not how:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["estimate", "--model", "Qwen/Qwen3-4B-Instruct-2507", *how]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and err.count("\n") == 0 and str(hf_cache) in err


def test_the_cli_downloads_a_config_once_and_says_so(hf_cache, monkeypatch, capsys):
    """Online (reachability and the download replaced here): config.json alone is fetched into the cache, and the
    next run finds it there."""
    calls = []

    def fake_download(repo_id, filename, cache_dir=None, **kw):
        calls.append((repo_id, filename))
        cache_config(hf_cache, repo_id, llama_1b() | {"vocab_size": 128_000})
        return str(next(hf_cache.glob(f"models--{repo_id.replace('/', '--')}/snapshots/*/{filename}")))

    monkeypatch.setattr(hub, "_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    assert main(["estimate", "--model", "someone/llama-variant"]) == 0
    assert calls == [("someone/llama-variant", "config.json")]
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("model someone/llama-variant: config.json from https://huggingface.co (downloaded now")
    assert main(["estimate", "--model", "someone/llama-variant"]) == 0
    assert len(calls) == 1 and "the Hugging Face cache" in capsys.readouterr().out.splitlines()[0]


def test_a_gated_or_missing_repository_is_one_line(hf_cache, monkeypatch, capsys):
    import httpx
    from huggingface_hub import errors

    def gated(repo_id, filename, **kw):
        url = f"https://huggingface.co/{repo_id}/resolve/main/{filename}"
        raise errors.GatedRepoError("403 gated", response=httpx.Response(403, request=httpx.Request("GET", url)))

    monkeypatch.setattr(hub, "_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", gated)
    assert main(["estimate", "--model", "meta-llama/Llama-4-Scout-17B-16E"]) == 2
    err = capsys.readouterr().err.strip()
    assert "is gated" in err and "hf auth login" in err and "\n" not in err
    monkeypatch.setattr(hub, "_reachable", lambda timeout=3.0: False)
    assert main(["estimate", "--model", "someone/elsewhere"]) == 2
    assert "cannot be reached from here" in capsys.readouterr().err


def test_hub_repo_of_reads_the_cache_layout():
    assert models.hub_repo_of("/c/hub/models--Qwen--Qwen3-4B/snapshots/abc/config.json") == "Qwen/Qwen3-4B"
    assert models.hub_repo_of("/some/dir/config.json") is None


def test_local_paths_that_hold_no_config_say_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "adapter_config.json").write_text("{}")
    assert main(["estimate", "--model", "ckpt"]) == 2
    assert "model directory 'ckpt' has no config.json" in capsys.readouterr().err
    assert main(["estimate", "--model", "ckpt/does-not-exist"]) == 2
    assert "'ckpt' is a local folder, and this path in it does not exist" in capsys.readouterr().err


def test_a_cached_models_twin_is_named_by_it(hf_cache, capsys):
    """measure's default, the tiny twin, is named after the hub id it twins (not 'config'), says it is the twin's
    own figure, and --no-progress leaves no progress bar."""
    cache_config(hf_cache, MIRROR, llama_1b())
    assert models.scaled_path(MIRROR).name.startswith("NousResearch--Llama-3.2-1B-scaled-")
    assert main(["measure", "--model", MIRROR, "--lora-rank", "8", "--seq", "128", "--steps", "2",
                 "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("NousResearch--Llama-3.2-1B-scaled-") and "the tiny twin's own figures" in out
    assert "training steps" not in err
