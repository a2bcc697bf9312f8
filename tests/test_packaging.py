"""The built-in names (configs, ISA, examples) resolve from a non-editable install too."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_carries_the_data_and_resolves_builtin_names(tmp_path):
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(ROOT)]
    subprocess.run(cmd, check=True, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("archsim-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("archsim/_builtin/configs/a100.yaml", "archsim/_builtin/configs/tiny-sunway.yaml",
                   "archsim/_builtin/configs/overlays/l2-off.yaml", "archsim/_builtin/isa/opcodes.yaml",
                   "archsim/_builtin/configs/reference/scale/sw26010pro.yaml",
                   "archsim/_builtin/isa/examples/gemm_mma.s", "archsim/_builtin/workloads/gpt2-small.yaml",
                   "archsim/_builtin/workloads/tiny.yaml", "archsim/cli.py"):
        assert needed in names, needed
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, cwd=tmp_path)
    probe = ("from archsim.paths import data_dir; from archsim.config import load_machine; "
             "from archsim.isa.asm import assemble_file; from archsim.workloads.model import load_workload; "
             "import archsim; "
             "assert archsim.__file__.startswith(%r), archsim.__file__; "
             "print(load_machine('sw26010pro').name, assemble_file(data_dir('isa') / 'examples' / 'gemm_mma.s').name, "
             "load_workload('bloom-176b').name)"
             % str(target))
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, cwd=tmp_path,
                         env=env)
    assert out.stdout.split() == ["sw26010pro", "gemm_mma", "bloom-176b"]
