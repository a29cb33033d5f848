"""Side-by-side benchmarks of vision_tx against reference libraries (run through tools/benchmark.py).

Each module defines ``run(device: str, quick: bool) -> list[Row]`` measuring vision_tx and the
reference in the same process, so the ratio is what to read.
"""
