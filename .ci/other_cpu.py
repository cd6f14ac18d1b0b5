"""Run a command as another CPU would: torch's kernels capped below this CPU's, so floating-point training rounds
differently here than on the machine that trained pins/ (issue 55).

    python .ci/other_cpu.py make test                                   # the whole suite (`make test-other-cpu`)
    python .ci/other_cpu.py pytest -q tests/test_pins.py                # any command
    python .ci/other_cpu.py --print                                     # the settings it would use, and why

A test or notebook cell that compares something trained during the run with the pinned bytes passes on the developers'
machine and fails on every other CPU; under these settings it fails here too, before anyone else meets it. The cap is
chosen from what this CPU offers (`torch.backends.cpu.get_cpu_capability()`): AVX-512 → AVX2 (ATen, MKL and oneDNN),
AVX2 → AVX (MKL's matmuls and oneDNN's convolutions without FMA; ATen's kernels as they are), anything else → the
portable kernels (ATen's scalar ones, MKL's conditional numerical reproducibility, oneDNN at SSE4.1). `bench/build_isa.py`
measures that each trains other weights than the native kernels. On an AVX2 machine (2026-12-02) the portable kernels
took 1.8-2.3x the time of convolutions and of matmul-GELU-softmax chains (the whole test suite about twice its time), the
AVX cap 1.1-1.4x; under it the micro zoo trains to other weights (models f16967b7 against 439c01b5 natively).
"""
import os, subprocess, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]/'bench'))
from build_isa import AVX, AVX2, PORTABLE   # the settings bench/build_isa.py measures, defined once there

def other_cpu_env()->tuple[str, dict]:
    "(this CPU's capability, the environment variables that make torch compute as a CPU without it)."
    cap = subprocess.run([sys.executable, '-c', 'import torch; print(torch.backends.cpu.get_cpu_capability())'],
                         check=True, capture_output=True, text=True).stdout.strip()
    return cap, AVX2 if cap.startswith('AVX512') else AVX if cap == 'AVX2' else PORTABLE

def main(argv:list[str])->int:
    cap, env = other_cpu_env()
    print(f"other_cpu: this CPU's kernels are {cap}; running with {' '.join(f'{k}={v}' for k, v in env.items())}", flush=True)
    if argv[:1] == ['--print'] or not argv: return 0
    return subprocess.run(argv, env={**os.environ, **env}).returncode

if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
