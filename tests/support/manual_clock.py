"""A clock for code that takes one (``clock=``): its seconds move only when a test moves them."""


class ManualClock:
    """Seconds, as a callable; set or advance :attr:`now`."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
