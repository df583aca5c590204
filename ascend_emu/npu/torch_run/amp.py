"""GradScaler's aten ops on the emulated device by torch_npu's rule per SoC (ASCEND-FACTS.md 13.2; NUMERICS.md
section 16): ``_amp_foreach_non_finite_check_and_unscale_`` and ``_amp_update_scale_``."""
from __future__ import annotations

from ...frontend import torch as _front  # noqa: F401  (first: without torch, the one-line error of the extra)
import torch  # noqa: E402
from torch.utils._mode_utils import no_dispatch  # noqa: E402

from ...frontend.torch import aten as _aten
from .launch import Launcher, same_values

#: the aten ops of GradScaler, run by the device's own rule
AMP_UNSCALE = "aten._amp_foreach_non_finite_check_and_unscale_"
AMP_UPDATE = "aten._amp_update_scale_"


def amp_unscale(self, func, args, kwargs, phase):
    """The non-finite check and unscale of the gradients: per tensor on INF_NAN SoCs; on saturation SoCs the float
    status register since its last clear (the gradients stay scaled on an overflow). ``self``: the run."""
    grads, found_inf, inv_scale = (list(args) + [kwargs.get("found_inf"), kwargs.get("inv_scale")])[:3]
    name = self._name("_amp_foreach_non_finite_check_and_unscale_", phase)
    k = Launcher(self, name)
    inv = float(inv_scale.reshape(-1)[0])
    if self.device.overflow_mode == "saturation":
        # the 910: NPUGetFloatStatus - any overflow since the last clear, the forward included; on an
        # overflow the gradients stay scaled ([OP] aclops/AmpForeachNonFiniteCheckAndUnscaleKernelNpu.cpp)
        found = bool(self.float_status.get())
        reason = (f"saturation mode: the float status register since the last clear "
                  f"(0x{self.float_status.get():x}) decides")
        if not found:
            for g in grads:
                k.host_copy(g, _aten._binary(k, "Mul", g, torch.tensor(inv, dtype=torch.float32)).to(g.dtype))
    else:
        # A2/A3/950: aclnnForeachNonFiniteCheckAndUnscale, a per-tensor non-finite check, then every
        # gradient times inv_scale
        found = False
        for g in grads:
            with no_dispatch():
                found |= not bool(torch.isfinite(g).all())
            k.host_copy(g, _aten._binary(k, "Mul", g, torch.tensor(inv, dtype=torch.float32)).to(g.dtype))
        reason = "INF_NAN mode: per-tensor non-finite check of the gradients"
    if found:
        with no_dispatch():
            found_inf.fill_(1.0)
    follow_unscale(self, grads, inv)
    k.types = ["ForeachNonFiniteCheckAndUnscale"]
    self._step_info["scaler"] = True
    self._step_info["found_inf"] = found
    self._record(k, func, phase, "AICORE", reason, args, None, name=name)
    return None

def amp_update(self, func, args, kwargs, phase):
    """The scale's update (torch_npu ``_npu_update_scale``); it ends the step. ``self``: the run."""
    scale, tracker, found_inf, growth, backoff, interval = list(args)[:6]
    name = self._name("_amp_update_scale_", phase)
    k = Launcher(self, name)
    with no_dispatch():
        old = float(scale.reshape(-1)[0])
        if float(found_inf.reshape(-1)[0]):
            scale.mul_(backoff)
            tracker.zero_()
        else:
            tracker.add_(1)
            if int(tracker.reshape(-1)[0]) == int(interval):
                new = scale * growth
                if bool(torch.isfinite(new).all()):     # torch_npu never grows the scale to Inf
                    scale.copy_(new)
                tracker.zero_()
    follow_values(self, (scale, tracker))
    k.types = ["AmpUpdateScale"]
    self._record(k, func, phase, "AICORE", "GradScaler's update (torch_npu _npu_update_scale)", args, scale,
                 name=name)
    self._step_info.update(loss_scale=old, next_loss_scale=float(scale.reshape(-1)[0]),
                           skipped=bool(self._step_info.get("found_inf")))
    self.end_step("grad_scaler")
    return scale


def follow_unscale(run, grads, inv: float) -> None:
    """The reference's side of GradScaler's unscale: each gradient's float32 twin times ``inv`` (the reference
    unscales what it computed; without this its gradients stayed scaled and its optimizer diverged)."""
    if run._writers is None or run._writers[1] is None:
        return
    with no_dispatch():
        for g in grads:
            twin = run._shadow.get(g)
            if twin is not None:
                run._shadow[g] = twin.float() * torch.tensor(inv, dtype=torch.float32)


def follow_values(run, tensors) -> None:
    """The reference takes the run's own values of ``tensors`` (the loss scale and its growth tracker: a policy
    the two runs share, not numerics to compare)."""
    if run._writers is None or run._writers[1] is None:
        return
    for t in tensors:
        run._shadow[t] = same_values(t)
