"""The failure throttles' sliding count seen from a test: where a fixed window used to end, and the
`Retry-After` a refusal must carry (`ratelimit.failures`)."""
from __future__ import annotations

import math


def just_before_a_boundary(clock, seconds: int, lead: float = 5.0) -> None:
    """Move `clock` (the runtime's) to `lead` seconds before a multiple of `seconds`: where a fixed
    window aligned to the clock ended, so failures made around it straddle that boundary."""
    clock.advance((seconds - clock.time() % seconds - lead) % seconds)


def expected_waits(oldest: tuple[float, float], refused: tuple[float, float], seconds: int) -> range:
    """The Retry-After values possible for a refusal made within `refused` (clock times before and
    after it) whose oldest counted failure was made within `oldest`: whole seconds until that failure
    is `seconds` old. The runtime's clock runs on between two readings, hence a range, not a value."""
    low = max(1, math.ceil(oldest[0] + seconds - refused[1]))
    high = max(1, math.ceil(oldest[1] + seconds - refused[0]))
    return range(low, high + 1)
