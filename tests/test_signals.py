"""nmt.signals.held: Ctrl-C inside the block is raised on leaving it, not inside; the mask and
the handlers are as they were after."""

from __future__ import annotations

import signal

import pytest

from nmt import signals


@pytest.mark.parametrize("block", [True, False])
def test_a_ctrl_c_inside_is_raised_on_leaving(block):
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    handlers = [signal.getsignal(s) for s in signals.STOP]
    reached = False
    with pytest.raises(KeyboardInterrupt), signals.held(block=block):
        signal.raise_signal(signal.SIGINT)
        for _ in range(1000):  # many bytecodes: Python's handler would have run by now
            pass
        reached = True
    assert reached
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask
    assert [signal.getsignal(s) for s in signals.STOP] == handlers


@pytest.mark.parametrize("block", [True, False])
def test_nothing_inside_leaves_the_mask_and_handlers_as_they_were(block):
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    handlers = [signal.getsignal(s) for s in signals.STOP]
    with signals.held(block=block):
        assert (signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])) == block
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask
    assert [signal.getsignal(s) for s in signals.STOP] == handlers
