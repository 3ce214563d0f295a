"""The laboratory the experiments run in: viabench on this host (shared
memory), viabench between two network-namespace hosts joined by a veth pair
(the UDP transport), criterion micro-benchmarks, and the provider's
profiles (VIA_PROFILE).

Every provider setting an experiment selects (VIA_DOORBELL, VIA_CQ, ...)
goes into the environment of both sides, so each configuration runs in
processes of its own: the provider reads its settings once per process.
"""

import json
import math
import os
import random
import re
import subprocess
import time


class Hosts:
    """Two network namespaces, `a` (client) and `b` (server), joined by a
    veth pair named vb0 on both sides.  Needs root; `up()` says whether it
    could build them."""

    def __init__(self, viad, agent_socket):
        tag = "%x" % (os.getpid() & 0xFFFF)
        self.a, self.b = "rpa" + tag, "rpb" + tag
        net = 30 + os.getpid() % 200
        self.addr_a, self.addr_b = "10.204.%d.1" % net, "10.204.%d.2" % net
        self.viad, self.agent_socket = viad, agent_socket
        self.made = []
        self.mtu = None

    def up(self):
        if os.geteuid() != 0:
            return False
        try:
            for ns in (self.a, self.b):
                subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
                self.made.append(ns)
            cmds = [
                ["ip", "link", "add", self.a + "v", "type", "veth", "peer", "name", self.b + "v"],
                ["ip", "link", "set", self.a + "v", "netns", self.a],
                ["ip", "link", "set", self.b + "v", "netns", self.b],
                ["ip", "-n", self.a, "link", "set", self.a + "v", "name", "vb0"],
                ["ip", "-n", self.b, "link", "set", self.b + "v", "name", "vb0"],
                ["ip", "-n", self.a, "addr", "add", self.addr_a + "/24", "dev", "vb0"],
                ["ip", "-n", self.b, "addr", "add", self.addr_b + "/24", "dev", "vb0"],
            ]
            for ns in (self.a, self.b):
                cmds += [["ip", "-n", ns, "link", "set", "lo", "up"], ["ip", "-n", ns, "link", "set", "vb0", "up"]]
            for c in cmds:
                subprocess.run(c, check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            self.down()
            return False
        self.set_mtu(1500)
        return True

    def set_mtu(self, mtu):
        """Sets the MTU of both ends; the host agents restart so that every
        later VipOpenNic sees it."""
        if mtu == self.mtu:
            return
        for ns in (self.a, self.b):
            subprocess.run(["ip", "-n", ns, "link", "set", "vb0", "mtu", str(mtu)], check=True, capture_output=True)
        self.stop_agents()
        self.mtu = mtu

    def stop_agents(self):
        for ns in self.made:
            subprocess.run(["ip", "netns", "exec", ns, self.viad, "--stop", "--socket", self.agent_socket],
                           capture_output=True)

    def down(self):
        self.stop_agents()
        for ns in self.made:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for p in pids:
                try:
                    os.kill(int(p), 9)
                except (OSError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made = []

    def run_in(self, ns):
        return ["ip", "netns", "exec", ns]


class Lab:
    """Runs viabench and the micro-benchmarks, keeps their raw output under
    `out`, and reads it back when `reuse` is set (rendering a report again
    without measuring again)."""

    def __init__(self, root, out, quick=False, reuse=False, log=print):
        self.root, self.out, self.quick, self.reuse, self.log = root, out, quick, reuse, log
        self.viabench_bin = os.path.join(root, "target", "release", "viabench")
        self.viad = os.path.join(root, "target", "release", "viad")
        self.agent_socket = "openvia-reproduce-%d" % os.getpid()
        self.env = dict(os.environ)
        for k in list(self.env):
            if k.startswith("VIA_"):
                del self.env[k]
        self.env.update(VIA_VIAD=self.viad, VIA_AGENT_SOCKET=self.agent_socket, VIA_VIAD_IDLE="5")
        self.hosts = None
        self.notes = []
        os.makedirs(out, exist_ok=True)

    # ------------------------------------------------------------ hosts

    def open_hosts(self):
        """Builds the two namespace hosts; False (and a note) without root."""
        if self.hosts is not None:
            return True
        hosts = Hosts(self.viad, self.agent_socket)
        if not hosts.up():
            self.note("the network experiments need root to build two network namespaces: skipped")
            return False
        self.hosts = hosts
        return True

    def close(self):
        if self.hosts:
            self.hosts.down()
        subprocess.run([self.viad, "--stop", "--socket", self.agent_socket], env=self.env, capture_output=True)

    def note(self, text):
        self.notes.append(text)
        self.log("note: " + text)

    # ------------------------------------------------------------ viabench

    def trial_args(self):
        if self.quick:
            return ["--trials", "1", "--min-time", "0.003", "--max-time", "0.05"]
        return ["--trials", "5", "--min-time", "0.02"]

    def viabench(self, exp, tag, args, settings=None, across=False, mtu=None, trials=True):
        """Runs viabench and returns its JSON report (None if it failed).
        `settings`: provider variables for both sides; `across`: between the
        namespace hosts over /dev/via_vb0 at `mtu`, else on this host over
        /dev/via_lo."""
        path = os.path.join(self.out, exp, tag + ".json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if self.reuse:
            return self.load(path)
        if os.path.exists(path):
            os.remove(path)
        env = dict(self.env)
        env.update(settings or {})
        common = list(args) + (self.trial_args() if trials else []) + ["--no-progress", "--json", path]
        log_path = path[:-5] + ".log"
        started = time.time()
        if across:
            if not self.open_hosts():
                return None
            self.hosts.set_mtu(mtu or 1500)
            rc = self._across(env, common, log_path)
        else:
            with open(log_path, "w") as log:
                rc = subprocess.run([self.viabench_bin, "--device", "/dev/via_lo"] + common, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, timeout=1800).returncode
        self.log("  %s/%s: %.1f s%s" % (exp, tag, time.time() - started, "" if rc == 0 else " (exit %d)" % rc))
        report = self.load(path)
        if report is None:
            self.note("viabench %s/%s produced no results (see %s)" % (exp, tag, os.path.relpath(log_path, self.out)))
        else:
            for t in report["tests"]:
                if t.get("error"):
                    self.note("%s/%s %s stopped: %s" % (exp, tag, t["label"], t["error"]))
        return report

    def _across(self, env, args, log_path):
        h = self.hosts
        for attempt in range(3):
            port = random.randint(5300, 5899)
            with open(log_path[:-4] + ".server.log", "w") as slog:
                server = subprocess.Popen(h.run_in(h.b) + [self.viabench_bin, "--server", "--once", "--port", str(port)],
                                          env=env, stdout=slog, stderr=subprocess.STDOUT)
            if not self._listening(h.b, port):
                server.kill()
                server.wait()
                continue
            with open(log_path, "w") as log:
                try:
                    rc = subprocess.run(h.run_in(h.a) + [self.viabench_bin, h.addr_b, "--port", str(port),
                                                         "--device", "/dev/via_vb0"] + args,
                                        env=env, stdout=log, stderr=subprocess.STDOUT, timeout=1800).returncode
                except subprocess.TimeoutExpired:
                    rc = 124
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            return rc
        return 1

    def _listening(self, ns, port):
        """Waits until the server in `ns` listens on `port`."""
        for _ in range(100):
            ss = subprocess.run(self.hosts.run_in(ns) + ["ss", "-ltnH", "sport", "= :%d" % port],
                                capture_output=True, text=True).stdout
            if ss.strip():
                return True
            time.sleep(0.05)
        return False

    @staticmethod
    def load(path):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    # ------------------------------------------------------------ criterion

    def criterion(self, exp, tag, bench_filter, settings=None):
        """Runs the criterion benchmarks matching `bench_filter` and returns
        {name: nanoseconds per iteration}."""
        path = os.path.join(self.out, exp, tag + ".criterion.txt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not self.reuse:
            env = dict(self.env)
            env.update(settings or {})
            times = ["--warm-up-time", "0.1", "--measurement-time", "0.2"] if self.quick else \
                ["--warm-up-time", "0.5", "--measurement-time", "1"]
            started = time.time()
            with open(path, "w") as f:
                subprocess.run(["cargo", "bench", "-q", "-p", "viabench", "--bench", "vipl", "--",
                                "--output-format", "bencher"] + times + [bench_filter],
                               cwd=self.root, env=env, stdout=f, stderr=subprocess.DEVNULL, timeout=1800)
            self.log("  %s/%s: %.1f s" % (exp, tag, time.time() - started))
        found = {}
        try:
            with open(path) as f:
                for line in f:
                    m = re.match(r"test (.+?) \.\.\. bench:\s+([\d,]+) ns/iter", line)
                    if m:
                        found[m.group(1)] = float(m.group(2).replace(",", ""))
        except OSError:
            pass
        if not found:
            self.note("criterion %s/%s measured nothing (see %s)" % (exp, tag, os.path.relpath(path, self.out)))
        return found

    # ------------------------------------------------------------ profiles

    def profile_path(self, exp, tag):
        path = os.path.join(self.out, exp, tag + ".profile.jsonl")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not self.reuse and os.path.exists(path):
            os.remove(path)
        return path

    @staticmethod
    def profiles(path):
        """The NICs' profile lines of a VIA_PROFILE file."""
        lines = []
        try:
            with open(path) as f:
                for line in f:
                    try:
                        lines.append(json.loads(line))
                    except ValueError:
                        pass
        except OSError:
            pass
        return lines


# ---------------------------------------------------------------- results


def test(report, label):
    """The test of a viabench report with this label, or None."""
    if not report:
        return None
    for t in report["tests"]:
        if t["label"] == label:
            return t
    return None


def row(report, label, size):
    t = test(report, label)
    if not t:
        return None
    for r in t["rows"]:
        if r["bytes"] == size:
            return r
    return None


def latency(report, label, size=4):
    r = row(report, label, size)
    return r["one_way_us"] if r else None


def peak(report, label):
    """(MB/s, bytes) of the test's fastest size."""
    t = test(report, label)
    if not t or not t["rows"]:
        return None, None
    r = max(t["rows"], key=lambda r: r["mb_per_s"])
    return r["mb_per_s"], r["bytes"]


def curve(report, label, key="mb_per_s"):
    """[(bytes, value)] of a test."""
    t = test(report, label)
    return [(r["bytes"], r[key]) for r in t["rows"]] if t else []


def half_bandwidth_size(points):
    """NetPIPE's n½: the smallest block size at which throughput reaches half
    the peak, interpolated on a log scale between measured sizes."""
    if not points:
        return None
    top = max(v for _, v in points) / 2
    prev = None
    for size, v in sorted(points):
        if v >= top:
            if prev is None or prev[1] >= v:
                return float(size)
            f = (top - prev[1]) / (v - prev[1])
            return math.exp(math.log(prev[0]) + f * (math.log(size) - math.log(prev[0])))
        prev = (size, v)
    return None
