"""The planted-bug list: single-line bugs of the kinds a claim of the test suite must rule out (a swapped,
skipped or dropped norm, a bias not loaded, a transposed table, a moved threshold), one file per area of the
package, each naming the tests that must fail with it. ``python scripts/mutants.py`` plants them one at a
time in a copy of the checkout; ``tests/scripts/test_mutants.py`` checks in the suite that each one's line
still occurs exactly once in its file and that its tests exist."""

from tests.mutants import backbones, data, detection, export, lightning, metrics, ops, scripts, segmentation, tools
from tests.mutants.mutant import Mutant

MUTANTS: list[Mutant] = [
    mutant
    for area in (backbones, ops, detection, segmentation, metrics, data, lightning, export, tools, scripts)
    for mutant in area.MUTANTS
]
