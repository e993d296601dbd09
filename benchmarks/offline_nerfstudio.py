"""Run a nerfstudio command with no network: LPIPS (whose weights download on construction) is replaced by a
metric that reports NaN when its weights are not on disk, and bytesplat's checkpoint allow-list is registered.
Used for the splatfacto baseline on the GPU machine, which has no network.
Usage: python offline_nerfstudio.py ns-train ARGS..."""

from __future__ import annotations

import sys

import bytesplat_ns  # noqa: F401  (registers the numpy types nerfstudio checkpoints hold)
from bytesplat_ns.lpips import stand_in_lpips_unless_on_disk

stand_in_lpips_unless_on_disk()


def main() -> None:
    tool, sys.argv = sys.argv[1], sys.argv[1:]
    if tool == "ns-train":
        from nerfstudio.scripts.train import entrypoint
    elif tool == "ns-eval":
        from nerfstudio.scripts.eval import entrypoint
    else:
        raise SystemExit(f"offline_nerfstudio.py runs ns-train or ns-eval, not {tool}")
    entrypoint()


if __name__ == "__main__":
    main()
