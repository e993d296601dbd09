"""Host time of what nerfstudio's training loop hands its event writers, tensorboard on (issues #4, #6).

Each step nerfstudio puts two timing scalars and each scheduled learning rate, every --steps-per-log steps the
loss, its terms, the metrics and the GPU memory too, and writes them all out (writer.write_out_storage) at the end
of the step. This runs that sequence alone, without training, through nerfstudio's tensorboard writer as
bytesplat's trainer sets it up (train_log.py) from the source tree given by --tree (an unpacked older commit for
an A/B, default this checkout), and reports host microseconds per step, the tensorboard writer thread drained at the
end of each repeat. Table last, --json.

    python3 benchmarks/log_writer_cost.py --json /tmp/log_writer_cost.json [--tree /tmp/old]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1], help="bytesplat source tree")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps-per-log", type=int, default=10)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    sys.path.insert(0, str(args.tree))
    import nerfstudio.configs.base_config  # noqa: F401  (before nerfstudio.utils.writer)
    from nerfstudio.utils import writer

    from bytesplat_ns import train_log

    tensorboard = writer.TensorboardWriter(log_dir=Path(tempfile.mkdtemp()))
    writer.EVENT_WRITERS[:] = [tensorboard]
    writer.GLOBAL_BUFFER.update({"max_buffer_size": 20, "max_iter": 10**9, "events": {},
                                 "steps_per_log": args.steps_per_log})  # fmt: skip
    train_log.log_timing_at_log_steps(args.steps_per_log)
    flush = getattr(train_log, "flush_log_writers", lambda: None)  # older trees write at once

    def step(s: int) -> None:  # what nerfstudio's loop and optimizers put, as in a bytesplat run on lego
        flush()  # bytesplat's trainer, at the start of a step
        writer.put_scalar("learning_rate/means", 1e-4, step=s)
        writer.put_time(writer.EventName.ITER_TRAIN_TIME, 0.001, step=s, update_eta=True)
        writer.put_time(writer.EventName.TRAIN_RAYS_PER_SEC, 1e6, step=s)
        if s % args.steps_per_log == 0:
            writer.put_scalar("Train Loss", 0.5, step=s)
            writer.put_dict("Train Loss Dict", {"main_loss": 0.4, "scale_reg": 0.0}, step=s)
            writer.put_dict("Train Metrics Dict", {"psnr": 25.0, "gaussian_count": 47000, "pruned_tile_entries": 0},
                            step=s)  # fmt: skip
            writer.put_scalar("GPU Memory (MB)", 1234.0, step=s)
        writer.write_out_storage()

    per_step = []
    for repeat in range(args.repeats):
        began = time.perf_counter()
        for s in range(repeat * args.steps, (repeat + 1) * args.steps):
            step(s)
        flush()
        tensorboard.tb_writer.flush()  # the writer thread's queue drained
        per_step.append(1e6 * (time.perf_counter() - began) / args.steps)
    report = {"tree": str(args.tree), "steps": args.steps, "steps_per_log": args.steps_per_log, "us_per_step": per_step}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{args.tree}: " + ", ".join(f"{us:.0f}" for us in per_step) + " us per step (repeats)")


if __name__ == "__main__":
    main()
