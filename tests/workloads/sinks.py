"""A phase sink that records what a PhaseTimer forwards (same API as workloads.phases.Reporter)."""


class RecordingSink:
    def __init__(self):
        self.phases = []
        self.steps = []

    def record_phase(self, name, start_ns, end_ns):
        self.phases.append((name, start_ns, end_ns))

    def step(self, samples=0, start_ns=None, end_ns=None):
        self.steps.append((start_ns, end_ns, samples))
