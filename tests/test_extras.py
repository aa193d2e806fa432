"""What the runtime install brings, and what each extra adds; the license shipped.

The runtime install (``pip install aiostream-hf``) streams; the local Hub server
needs uvicorn (the ``server`` extra) and webdataset's image decoders need Pillow
(the ``image`` extra). Without an extra, the feature that needs it fails at once
with one line that names it. These tests read the installed distribution's
metadata, and run Python in a subprocess with the module blocked
(``sys.modules[name] = None``), so nothing is uninstalled.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
DIST = "aiostream-hf"
REINSTALL = "the installed metadata is stale: reinstall with .venv/bin/pip install -e ."


def requirements() -> list[Requirement]:
    return [Requirement(r) for r in metadata.requires(DIST) or []]


def installs(*extras: str) -> set[str]:
    """The distributions ``pip install 'aiostream-hf[extras]'`` asks for (extras of
    aiostream-hf itself, such as ``test`` -> ``server``, followed)."""
    reqs = requirements()

    def wanted(req: Requirement, active: set[str]) -> bool:
        return req.marker is None or any(req.marker.evaluate({"extra": e}) for e in active)

    active, pending = {""}, set(extras)
    while pending:
        active |= pending
        pending = {
            extra
            for req in reqs
            if canonicalize_name(req.name) == DIST and wanted(req, active)
            for extra in req.extras
        } - active
    return {
        canonicalize_name(req.name)
        for req in reqs
        if canonicalize_name(req.name) != DIST and wanted(req, active)
    }


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
        cwd=ROOT,
    )


# -- metadata -------------------------------------------------------------------------------


def test_uvicorn_and_pillow_come_only_with_their_extras() -> None:
    extras = set(metadata.metadata(DIST).get_all("Provides-Extra") or [])
    assert {"server", "image", "test"} <= extras, REINSTALL
    runtime = installs()
    assert "anyio" in runtime
    assert "uvicorn" not in runtime
    assert "pillow" not in runtime
    for req in requirements():
        if canonicalize_name(req.name) in ("uvicorn", "pillow"):
            assert req.marker is not None, req  # only ever under an extra marker
    assert "uvicorn" in installs("server")
    assert "pillow" in installs("image")
    # The tests serve every dataset from the local server and decode images.
    assert {"uvicorn", "pillow", "pytest", "trio"} <= installs("test")
    assert "uvicorn" in installs("bench")


def test_the_apache_license_is_shipped() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    for part in (
        "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
        "9. Accepting Warranty or Additional Liability.",
        "END OF TERMS AND CONDITIONS",
        "APPENDIX: How to apply the Apache License to your work.",
    ):
        assert part in text
    assert len(text.splitlines()) == 202  # apache.org's LICENSE-2.0.txt, line for line
    meta = metadata.metadata(DIST)
    assert meta["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in (meta.get_all("License-File") or []), REINSTALL


# -- without the server extra ---------------------------------------------------------------

WITHOUT_UVICORN = """
import sys
sys.modules["uvicorn"] = None  # as if the server extra were not installed
import aiostream_hf, aiostream_hf.testing
from aiostream_hf.testing import HubServer, make_repo, make_text_parquet

repo = make_repo(sys.argv[1], "org/text", {"README.md": "# text\\n"})
make_text_parquet(repo / "data/train.parquet", rows=10)  # the makers need no server
for in_subprocess in (False, True):
    try:
        HubServer(sys.argv[1], subprocess=in_subprocess).start()
    except aiostream_hf.HubServerError as exc:
        print(type(exc).__name__, exc, sep=": ")
    else:
        print("started")
"""

NO_SERVER = (
    "the local Hub server (HubServer) needs uvicorn, which is not installed: "
    "pip install 'aiostream-hf[server]'"
)


def test_without_uvicorn_the_package_imports_and_a_server_names_the_extra(
    tmp_path: Path,
) -> None:
    proc = run_python(WITHOUT_UVICORN, str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"HubServerError: {NO_SERVER}"] * 2
    assert proc.stderr == ""  # in a subprocess too: no child traceback


def test_without_uvicorn_hub_serve_fails_with_one_line(tmp_path: Path) -> None:
    code = """
    import sys
    sys.modules["uvicorn"] = None
    from aiostream_hf.cli import main
    main(["hub", "serve", sys.argv[1]], prog_name="aiostream-hf")
    """
    proc = run_python(code, str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [f"Error: {NO_SERVER}"]


# -- without the image extra (or torch) -------------------------------------------------

IMAGE_DECODE = """
import sys
sys.modules[sys.argv[1]] = None  # as if it were not installed
import webdataset as wds
import aiostream_hf as ash
import aiostream_hf.webdataset as ashwds

url = "https://example.invalid/train-{000000..000001}.tar"
for decode in sys.argv[2:]:
    spec = wds.imagehandler(decode[8:]) if decode.startswith("handler:") else decode
    for make in (
        lambda: ashwds.stream(url, decode=spec),
        lambda: ash.stream(url, format=ashwds.WebDatasetDecoder(decode=[spec])),
    ):
        try:
            make()
        except ash.SourceError as exc:
            print(exc)
        else:
            print("accepted", decode)
ashwds.stream(url)  # bytes need neither
ashwds.stream(url, decode=lambda key, data: None)  # nor a handler of your own
print("bytes and handlers: fine")
"""


@pytest.mark.parametrize(
    ("blocked", "specs", "extra"),
    [
        ("PIL", ["rgb8", "pil", "torchrgb", "handler:rgba8"], "image"),
        ("torch", ["torchrgb8"], "torch"),
    ],
)
def test_image_decode_without_its_library_fails_when_the_stream_is_made(
    blocked: str, specs: list[str], extra: str
) -> None:
    proc = run_python(IMAGE_DECODE, blocked, *specs)
    assert proc.returncode == 0, proc.stderr
    library = "Pillow" if blocked == "PIL" else "torch"
    expected = []
    for spec in specs:
        shown = spec.removeprefix("handler:")
        line = (
            f"decode={shown!r} decodes images with {library}, which is not installed: "
            f"pip install 'aiostream-hf[{extra}]'"
        )
        expected += [line, line]
    assert proc.stdout.splitlines() == [*expected, "bytes and handlers: fine"]


# -- without the ray or torch extra ---------------------------------------------------------

WITHOUT = """
import sys
import aiostream_hf, aiostream_hf.lerobot
print({module!r} in sys.modules)  # the package never imports it on its own
sys.modules[{module!r}] = None  # as if the extra were not installed
try:
    import aiostream_hf.{module}
except ImportError as exc:
    print(exc)
"""


@pytest.mark.parametrize(("module", "library"), [("ray", "Ray Data"), ("torch", "PyTorch")])
def test_without_an_extra_its_module_names_it(module: str, library: str) -> None:
    proc = run_python(WITHOUT.format(module=module))
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert first == "False"
    assert second.startswith(f"aiostream_hf.{module} needs {library}, which cannot be imported (")
    assert second.endswith(f"): pip install 'aiostream-hf[{module}]'")


# -- without the s3 extra (botocore) ----------------------------------------------------

WITHOUT_BOTOCORE = """
import sys
sys.modules["botocore"] = None  # as if the s3 extra were not installed
import aiostream_hf as ash
from aiostream_hf import lerobot, video

for make in (
    lambda: ash.stream("s3://bucket/shards/train-{000..009}.tar"),
    lambda: video.open("s3://bucket/clip.mp4"),
    lambda: lerobot.stream("s3://bucket/robot/"),
):
    try:
        make()
    except ash.SourceError as exc:
        print(exc)
    else:
        print("accepted")
ash.stream("https://example.invalid/train-{000..009}.tar")  # other sources need nothing
print("https: fine")
"""

NO_BOTOCORE = (
    "s3:// sources need botocore (request signing, AWS credentials), which is not "
    "installed: pip install 'aiostream-hf[s3]'"
)


def test_without_botocore_an_s3_source_names_the_extra_when_the_stream_is_made() -> None:
    assert "botocore" in installs("s3"), REINSTALL
    assert "botocore" not in installs()
    assert {"botocore", "moto", "boto3"} <= installs("test"), REINSTALL
    proc = run_python(WITHOUT_BOTOCORE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [NO_BOTOCORE] * 3 + ["https: fine"]
