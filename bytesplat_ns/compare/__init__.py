"""bytesplat-compare: a baseline and a candidate method trained in pairs on one scene, judged by preselected limits.

cli (entry point) -> resume (what an earlier invocation left in --output, reused) -> lanes (--devices: pairs side
by side) -> runner (one worker process per run) -> worker (training with timed held-out evaluations)
-> report (stats: paired statistics, limits: verdict, figures: plot and side-by-side views).
"""
