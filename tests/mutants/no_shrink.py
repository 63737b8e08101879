"""pytest plugin (``-p tests.mutants.no_shrink``) for the kept-mutant runs: a property test expected
to fail on a mutant stops at its first failing example (no shrinking) and keeps no example database."""
from hypothesis import Phase, settings

settings.register_profile("teye-mutants", phases=(Phase.explicit, Phase.generate), database=None)
settings.load_profile("teye-mutants")
