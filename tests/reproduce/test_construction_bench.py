"bench/construction_paper000.py's pre-training schedule: CLIP's warm-up and cosine decay on the AdamW `pretrain_clip` creates, inside the block only."
import pytest, torch

from conftest import bench_module

def _bench(): return bench_module('construction_paper000')   # it imports diagnose_paper000 beside it

def _lrs(steps):
    p = torch.nn.Parameter(torch.zeros(2)); opt = torch.optim.AdamW([p], lr=1e-3); out = []
    for _ in range(steps):
        p.grad = torch.ones(2); opt.step(); out.append(opt.param_groups[0]['lr'])
    return out

def test_cosine_schedule_hand_worked():
    "10 steps, 2 of warm-up: 1/2 and 2/2 of the lr, then cos from 1 (step 2) through ½ (step 6, half way) towards 0."
    m, base = _bench(), torch.optim.AdamW
    with m.pretrain_schedule('cosine', 10, 2): lrs = _lrs(10)
    assert lrs[0] == pytest.approx(0.5e-3) and lrs[1] == pytest.approx(1e-3) and lrs[2] == pytest.approx(1e-3)
    assert lrs[6] == pytest.approx(0.5e-3) and 0 < lrs[9] < lrs[8] < lrs[7] < lrs[6]
    assert torch.optim.AdamW is base   # restored: the experts' fine-tuning after it keeps its own optimizer

def test_constant_schedule_is_the_package_own():
    m, base = _bench(), torch.optim.AdamW
    with m.pretrain_schedule('constant', 10, 2):
        assert torch.optim.AdamW is base
        assert _lrs(3) == [1e-3] * 3
