"""Loss-scale managers against the update rules of ASCEND-FACTS.md section 5, step by step."""
import pytest

from ascend_emu.errors import AscendEmuError
from ascend_emu.npu.loss_scale import ExponentialUpdateLossScaleManager, FixedLossScaleManager, apply_step
from ascend_emu.numerics.status import FloatStatus


def test_exponential_manager_sequence():
    m = ExponentialUpdateLossScaleManager(init_loss_scale=2 ** 10, incr_every_n_steps=3,
                                          decr_every_n_nan_or_inf=2, incr_ratio=2, decr_ratio=0.5)
    trace = []
    for finite in [True, True, True, False, True, False, False, True, True, True]:
        applied = m.update(finite)
        trace.append((applied, m.loss_scale, m.good_steps, m.bad_steps))
    assert trace == [
        (True, 1024, 1, 0), (True, 1024, 2, 0), (True, 2048, 0, 0),   # third finite step: grow, reset
        (False, 2048, 0, 1),                                           # one bad step: counted
        (True, 2048, 1, 1),                                            # good steps keep the bad count
        (False, 1024, 0, 0),                                           # second bad step: shrink, reset
        (False, 1024, 0, 1), (True, 1024, 1, 1), (True, 1024, 2, 1), (True, 2048, 0, 0),
    ]


def test_bad_step_resets_good_count_and_scale_floor_is_one():
    m = ExponentialUpdateLossScaleManager(1.0, incr_every_n_steps=1000, decr_every_n_nan_or_inf=1)
    m.update(True)
    assert m.good_steps == 1
    assert m.update(False) is False
    assert m.loss_scale == 1.0 and m.good_steps == 0


def test_scale_stops_growing_near_float32_max():
    m = ExponentialUpdateLossScaleManager(2.0 ** 127, incr_every_n_steps=1)
    m.update(True)
    assert m.loss_scale == 2.0 ** 127 and m.good_steps == 0


def test_seed_004_configuration():
    m = ExponentialUpdateLossScaleManager(2 ** 32, incr_every_n_steps=1000, decr_every_n_nan_or_inf=2,
                                          decr_ratio=0.5)
    for _ in range(2):
        m.update(False)
    assert m.loss_scale == 2 ** 31


def test_apply_step_reads_and_clears_the_status():
    st = FloatStatus()
    m = FixedLossScaleManager(1024)
    st.record(0x100)
    assert apply_step(m, st) is False and st.get() == 0
    assert apply_step(m, st) is True
    assert FixedLossScaleManager(8, enable_overflow_check=False).update(False) is True


def test_bad_arguments():
    with pytest.raises(AscendEmuError):
        FixedLossScaleManager(0.5)
    with pytest.raises(AscendEmuError):
        ExponentialUpdateLossScaleManager(1, 10, incr_ratio=0.5)
