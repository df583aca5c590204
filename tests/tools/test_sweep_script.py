"""A sweep on scheduler='local' from a script without the ``if __name__ == "__main__":`` guard.

Dask's LocalCluster spawns its workers, and each spawned process imports the script again; a script that
calls the sweep at its top level then tries to start a cluster from inside a worker's start, which
multiprocessing refuses. distributed only says "Nanny failed to start."; the sweep says why and what to do.
"""
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_an_unguarded_script_is_told_to_guard_its_sweep(tmp_path):
    pytest.importorskip("distributed")
    script = tmp_path / "sweep_script.py"
    script.write_text(textwrap.dedent("""\
        import math
        import ascend_emu as ae
        with ae.Sweep("local", n_workers=1, progress=False) as sw:
            print(sw.map(math.sqrt, [4.0, 9.0]))
        """))
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "NUMBA_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env,
                       timeout=180)
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("ascend_emu.errors.AscendEmuError: the local Dask cluster's workers did not start"), last
    assert 'under `if __name__ == "__main__":`' in last and "scheduler='none'" in last, last
