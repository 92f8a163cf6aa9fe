"""The PyTorch client against real PyTorch: a model and its optimizer through shared memory and
storage, bit for bit, and a trainer process killed with SIGKILL whose checkpoint the agent persists."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import unittest

import torch

from goodput.checkpoint import CheckpointError, FlashCheckpoint


def make_training(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, opt


def train(model, opt, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    loss = None
    for _ in range(steps):
        x = torch.randn(16, 32, generator=g)
        y = torch.randn(16, 4, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return float(loss)


def same(a, b):
    """Bit-identical, nested."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and bytes(a.contiguous().reshape(-1).view(torch.uint8).numpy()) ==
                bytes(b.contiguous().reshape(-1).view(torch.uint8).numpy()))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) == type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


class FlashCheckpointTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.prefix = f"/gp-pytest-{os.getpid()}-{self.id().rsplit('.', 1)[-1]}"
        self.ckpt = FlashCheckpoint("pytest", storage_dir=self.dir.name, shm_prefix=self.prefix)

    def tearDown(self):
        self.ckpt.remove_memory()
        self.dir.cleanup()

    def state(self, model, opt, step):
        return {"model": model.state_dict(), "optim": opt.state_dict(), "rng": torch.get_rng_state(),
                "step": step, "meta": {"lr": 1e-2, "name": "mlp", "history": [1, 2.5, "x"], "pair": (3, None)}}

    def test_model_and_optimizer_round_trip_through_memory_and_storage(self):
        model, opt = make_training()
        train(model, opt, 5)
        saved = self.state(model, opt, 5)
        stats = self.ckpt.save(5, saved)
        self.assertGreater(stats["bytes"], 0)

        step, loaded = self.ckpt.load()
        self.assertEqual(step, 5)
        self.assertEqual(self.ckpt.last_load["tier"], "memory")
        self.assertTrue(same(saved, loaded))
        self.assertEqual(type(loaded["model"]).__name__, "OrderedDict")

        self.assertTrue(self.ckpt.persist()["written"])
        self.ckpt.remove_memory()
        step, from_disk = self.ckpt.load()
        self.assertEqual(step, 5)
        self.assertEqual(self.ckpt.last_load["tier"], "storage")
        self.assertTrue(same(saved, from_disk))

        # The restored model and optimizer continue exactly as the original would.
        model2, opt2 = make_training(seed=99)
        model2.load_state_dict(from_disk["model"])
        opt2.load_state_dict(from_disk["optim"])
        self.assertEqual(train(model, opt, 3, seed=7), train(model2, opt2, 3, seed=7))

    def test_load_into_the_live_model_and_optimizer(self):
        model, opt = make_training()
        train(model, opt, 4)
        self.ckpt.save(4, {"model": model.state_dict(), "optim": opt.state_dict(), "step": 4})
        # Another process's model and optimizer: same structure, other values (one step taken so
        # the optimizer has its state tensors).
        model2, opt2 = make_training(seed=5)
        train(model2, opt2, 1, seed=9)
        params = [p.data_ptr() for p in model2.parameters()]
        target = {"model": model2.state_dict(), "optim": opt2.state_dict(), "step": 0}
        step, state = self.ckpt.load(into=target)
        self.assertEqual((step, state["step"]), (4, 4))
        n = len(model2.state_dict()) + sum(len(v) for v in opt2.state_dict()["state"].values())
        self.assertEqual(self.ckpt.last_load["placed"], n, "every tensor read straight into its place")
        self.assertEqual([p.data_ptr() for p in model2.parameters()], params, "filled in place")
        self.assertTrue(same(model.state_dict(), model2.state_dict()))
        self.assertTrue(same(opt.state_dict()["state"], opt2.state_dict()["state"]))
        self.assertEqual(train(model, opt, 3, seed=7), train(model2, opt2, 3, seed=7))

        # From storage the tensors are copied in (not placed); the values are the same.
        self.ckpt.persist()
        self.ckpt.remove_memory()
        model3, opt3 = make_training(seed=6)
        train(model3, opt3, 1, seed=9)
        self.ckpt.load(into={"model": model3.state_dict(), "optim": opt3.state_dict(), "step": 0})
        self.assertEqual((self.ckpt.last_load["tier"], self.ckpt.last_load["placed"]), ("storage", 0))
        model4, _ = make_training()
        train(model4, torch.optim.Adam(model4.parameters(), lr=1e-2), 4)
        self.assertTrue(same(model4.state_dict(), model3.state_dict()))

        # A model of another shape is refused by name, not filled with the wrong bytes silently.
        other = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        with self.assertRaisesRegex(CheckpointError, r"into: tensor \('model', '2.weight'\) is torch.float32 \[8, 64\]"):
            self.ckpt.load(into={"model": other.state_dict(), "optim": opt3.state_dict(), "step": 0})
        with self.assertRaisesRegex(CheckpointError, "into: its tensors are not the checkpoint's"):
            self.ckpt.load(into={"model": model3.state_dict()})

    def test_a_file_system_that_refuses_direct_writes_gets_the_checkpoint_buffered(self):
        # Large checkpoints are written around the page cache (O_DIRECT); where the file system
        # refuses that at write time, the persist falls back to buffered writes of the whole file.
        shim_dir = tempfile.mkdtemp(prefix="goodput-direct-")
        self.addCleanup(subprocess.run, ["rm", "-rf", shim_dir])
        shim = os.path.join(shim_dir, "direct_refused.so")
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", shim,
                        os.path.join(os.path.dirname(os.path.abspath(__file__)), "direct_refused.c"), "-ldl"], check=True)
        storage = os.path.join(self.dir.name, "refused")
        code = textwrap.dedent(f"""
            import torch
            from goodput.checkpoint import FlashCheckpoint
            c = FlashCheckpoint("refused", storage_dir={storage!r}, shm_prefix={self.prefix + "-refused"!r})
            g = torch.Generator().manual_seed(3)
            c.save(9, {{"w": torch.randn(3 << 20, generator=g), "step": 9}})  # 12 MiB: a direct write
            print(c.persist()["written"])
            c.remove_memory()
        """)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(os.environ, LD_PRELOAD=shim))
        self.assertEqual(out.stdout.strip(), "True", out.stderr)
        c = FlashCheckpoint("refused", storage_dir=storage, shm_prefix=self.prefix + "-refused")
        step, state = c.load()
        self.assertEqual((step, c.last_load["tier"]), (9, "storage"))
        self.assertTrue(same(state["w"], torch.randn(3 << 20, generator=torch.Generator().manual_seed(3))))

    def test_zero_copy_load_views_shared_memory(self):
        model, opt = make_training()
        train(model, opt, 2)
        self.ckpt.save(2, {"model": model.state_dict()})
        step, state = self.ckpt.load(zero_copy=True)
        self.assertEqual(step, 2)
        self.assertEqual(self.ckpt.last_load["tier"], "memory")
        fresh, _ = make_training(seed=3)
        fresh.load_state_dict(state["model"])  # the one copy: shared memory -> parameters
        self.assertTrue(same(model.state_dict(), fresh.state_dict()))

    def test_odd_tensors(self):
        state = {"bf16": torch.randn(5, 3).to(torch.bfloat16), "noncontig": torch.arange(20.0).view(4, 5).t(),
                 "scalar": torch.tensor(3.5), "empty": torch.empty(0, 7), "int": torch.arange(10, dtype=torch.int64),
                 "bool": torch.tensor([True, False]), "shared": None}
        state["shared"] = state["int"]  # the same tensor twice comes back as equal tensors
        self.ckpt.save(1, state)
        _, back = self.ckpt.load()
        for k in state:
            self.assertTrue(same(state[k].contiguous(), back[k]), k)

    def test_nothing_to_load_and_corruption_is_an_error_with_reasons(self):
        self.assertEqual(self.ckpt.load(), (None, None))
        self.ckpt.save(1, {"w": torch.ones(1000)})
        # Corrupt shared memory: with no storage copy, the load must fail loudly, not return junk.
        path = "/dev/shm" + self.prefix + "-r0-a"
        with open(path, "r+b") as f:
            f.seek(64 + 100)
            b = f.read(1)
            f.seek(64 + 100)
            f.write(bytes([b[0] ^ 0xFF]))
        with self.assertRaisesRegex(CheckpointError, "checksum mismatch"):
            self.ckpt.load()

    def test_killed_trainer_is_persisted_by_the_agent_and_a_fresh_process_resumes(self):
        script = textwrap.dedent(f"""
            import os, signal, sys, torch
            sys.path.insert(0, {os.path.dirname(os.path.dirname(__import__('goodput').__file__))!r})
            from goodput.checkpoint import FlashCheckpoint
            sys.path.insert(0, {os.path.dirname(__file__)!r})
            from test_checkpoint import make_training, train
            model, opt = make_training()
            train(model, opt, 4)
            ckpt = FlashCheckpoint("pytest", storage_dir={self.dir.name!r}, shm_prefix={self.prefix!r})
            ckpt.save(4, {{"model": model.state_dict(), "optim": opt.state_dict()}})
            print("saved", flush=True)
            signal.pause()
        """)
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        self.assertEqual(proc.stdout.readline().strip(), "saved")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        self.assertEqual(proc.returncode, -signal.SIGKILL)
        self.assertEqual(self.ckpt.storage_steps(), [])
        self.assertTrue(self.ckpt.persist()["written"])  # the agent's reaction to the exit
        self.ckpt.remove_memory()                         # the node is replaced
        step, state = FlashCheckpoint("pytest", storage_dir=self.dir.name, shm_prefix=self.prefix).load()
        self.assertEqual(step, 4)
        model, opt = make_training(seed=5)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        ref_model, ref_opt = make_training()
        train(ref_model, ref_opt, 4)
        self.assertEqual(train(model, opt, 2, seed=3), train(ref_model, ref_opt, 2, seed=3))

    def test_async_persister_in_the_background(self):
        p = self.ckpt.async_persister()
        for step in range(1, 6):
            self.ckpt.save(step, {"w": torch.full((1000,), float(step))})
            p.request()
        p.drain()
        self.assertEqual(p.persisted_step(), 5)
        self.assertEqual(p.last_error(), "")


if __name__ == "__main__":
    unittest.main()
