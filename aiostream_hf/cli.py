"""The ``aiostream-hf`` command line."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ._exceptions import AiostreamError

__all__ = ["main"]


class _Group(click.Group):
    """Turns library errors into a one-line message and exit code 1."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except AiostreamError as exc:
            raise click.ClickException(str(exc)) from exc


@click.group(cls=_Group)
@click.version_option(package_name="aiostream-hf")
def main() -> None:
    """Stream datasets from the Hugging Face Hub and HTTP object stores."""


@main.group(cls=_Group)
def hub() -> None:
    """The local Hub-compatible server (for tests, demos and offline work)."""


def _grant(values: tuple[str, ...], option: str) -> dict[str, list[str]]:
    grants: dict[str, list[str]] = {}
    for value in values:
        repo, sep, token = value.partition("=")
        if not sep or repo.count("/") != 1 or not token:
            raise click.BadParameter(f"{value!r}: expected ORG/NAME=TOKEN", param_hint=option)
        grants.setdefault(repo, []).append(token)
    return grants


@hub.command("serve")
@click.argument("root", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=0, show_default=True, help="Hub port (0: a free one).")
@click.option("--cdn-port", default=0, show_default=True, help="CDN port (0: a free one).")
@click.option("--latency-ms", default=0.0, show_default=True, help="Added to every request.")
@click.option("--bandwidth-per-connection", type=float, help="Bytes/s cap per connection.")
@click.option("--bandwidth-total", type=float, help="Bytes/s cap for the whole server.")
@click.option("--error-rate", default=0.0, show_default=True, help="Share of 503 answers.")
@click.option("--cut-rate", default=0.0, show_default=True, help="Share of bodies cut mid-way.")
@click.option("--slow-first-byte-rate", default=0.0, show_default=True)
@click.option("--slow-first-byte-ms", default=1000.0, show_default=True)
@click.option("--api-quota", type=int, help="API requests per client per window.")
@click.option("--resolvers-quota", type=int, help="Resolver requests per client per window.")
@click.option("--window-s", default=300.0, show_default=True, help="Rate-limit window.")
@click.option("--private", multiple=True, metavar="ORG/NAME=TOKEN", help="A private repo.")
@click.option("--gated", multiple=True, metavar="ORG/NAME=TOKEN", help="A gated repo.")
def hub_serve(
    root: Path,
    host: str,
    port: int,
    cdn_port: int,
    latency_ms: float,
    bandwidth_per_connection: float | None,
    bandwidth_total: float | None,
    error_rate: float,
    cut_rate: float,
    slow_first_byte_rate: float,
    slow_first_byte_ms: float,
    api_quota: int | None,
    resolvers_quota: int | None,
    window_s: float,
    private: tuple[str, ...],
    gated: tuple[str, ...],
) -> None:
    """Serve the dataset repos under ROOT/datasets/ORG/NAME like the Hub.

    Prints one JSON line with the endpoints when ready; runs until Ctrl-C.
    """
    from .testing._hub_server import serve_forever

    serve_forever(
        {
            "root": str(root),
            "host": host,
            "port": port,
            "cdn_port": cdn_port,
            "faults": {
                "latency_ms": latency_ms,
                "bandwidth_per_connection": bandwidth_per_connection,
                "bandwidth_total": bandwidth_total,
                "error_rate": error_rate,
                "cut_rate": cut_rate,
                "slow_first_byte_rate": slow_first_byte_rate,
                "slow_first_byte_ms": slow_first_byte_ms,
            },
            "rate_limits": {"api": api_quota, "resolvers": resolvers_quota, "window_s": window_s},
            "private": _grant(private, "--private"),
            "gated": _grant(gated, "--gated"),
        },
        ready=sys.stdout,
    )


if __name__ == "__main__":
    main()
