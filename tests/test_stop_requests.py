"""`interrupts.stop_requests`: the first SIGINT/SIGTERM asks a loop to stop at a safe point."""

from __future__ import annotations

import signal

import pytest

from resstream import interrupts

pytestmark = pytest.mark.usefixtures("default_signal_handlers")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_first_signal_only_asks_for_a_stop(sig):
    seen = []

    def loop():
        with interrupts.stop_requests() as stop:
            seen.append(stop.requested)
            signal.raise_signal(sig)
            seen.append(stop.requested)  # no exception: the loop decides when
            stop.stop()

    with pytest.raises(KeyboardInterrupt):
        loop()
    assert seen == [False, True]
    assert interrupts.was_interrupted() is False  # not a command-line process: nothing remembered


def test_a_second_ctrl_c_interrupts_at_once():
    reached = []

    def loop():
        with interrupts.stop_requests():
            signal.raise_signal(signal.SIGINT)
            reached.append("first")
            signal.raise_signal(signal.SIGINT)
            reached.append("second")

    with pytest.raises(KeyboardInterrupt):
        loop()
    assert reached == ["first"]


def test_a_stop_not_taken_is_delivered_when_the_block_ends():
    with pytest.raises(KeyboardInterrupt), interrupts.stop_requests():
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_handlers_come_back_and_nothing_is_left_pending():
    sigterm_before = signal.getsignal(signal.SIGTERM)
    with interrupts.stop_requests() as stop:
        assert signal.getsignal(signal.SIGTERM) is not sigterm_before
    assert not stop.requested
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is sigterm_before
