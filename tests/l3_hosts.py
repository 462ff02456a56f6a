"""Separate network hosts on one machine for the L3 tests across hosts (issue 51): Linux network namespaces joined by a
bridge, an address per host on those links only, per-host `tbf` bandwidth caps, `partition(a, b)` / `heal()`, and
processes started inside a host by `ip netns exec`, all stopped by pid and deleted in teardown.

Layout: one namespace `<tag>sw` holds the bridge `br0` (the switch); each host is a namespace `<tag><name>` whose
`eth0` is a veth pair with its other end `p<i>` on that bridge. Hosts get 10.251.0.<i+1>/24 and `lo`; no default
route, no link into the root namespace, so nothing a host sends can leave the namespaces made here.

- `cap(name, rate)`: a token-bucket (`tc qdisc ... tbf`) on both directions of that host's link (its `eth0` egress and
  the bridge port's egress towards it).
- `partition(a, b)`: each of `a` and `b` gets a permanent neighbour entry for the other's address pointing at a MAC
  no host has, so the frames between them are dropped silently (in flight TCP stalls, as when a link goes away; no
  error comes back at once). Other pairs are unaffected. (`iptables`/`nft` are not installed here and `tc` drop actions
  need a kernel module that is not loaded, so a neighbour entry is the partition every such machine can make.)
  `heal()` deletes those entries; ARP finds the real peers again.
- `isolate(a)` / `heal()`: `a`'s link set down (every peer partitioned at once).
- `spawn(name, argv)`: a process inside host `name` (`ip netns exec` execs it, so its pid is the process's), killed by
  pid in `close()`.

`close()` (idempotent, also registered with atexit) kills every process spawned by pid and deletes every namespace
it made (deleting a namespace deletes the veth ends inside it). `hosts_unavailable()` is the reason namespaces cannot
be made here (not root, no `ip`, the kernel refuses), or None.
"""
import atexit, ctypes, os, shutil, signal, subprocess, time

SUBNET = '10.251.0'
BOGUS_MAC = '02:00:5e:10:51:51'       # a locally administered address no host here has


def _run(*argv, check=True):
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0: raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r


def _die_with_parent():
    try: ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG
    except Exception: pass


_REASON = []
def hosts_unavailable():
    "Why network namespaces cannot be made here, or None (probed once: a namespace added and deleted)."
    if not _REASON:
        if os.geteuid() != 0: _REASON.append('network namespaces need root (ip netns add)')
        elif not shutil.which('ip') or not shutil.which('tc'): _REASON.append('no `ip`/`tc` (iproute2) on PATH')
        else:
            name = f'tsl3probe{os.getpid()}'
            r = _run('ip', 'netns', 'add', name, check=False)
            _run('ip', 'netns', 'del', name, check=False)
            _REASON.append(None if r.returncode == 0 else f'ip netns add failed: {r.stderr.strip()}')
    return _REASON[0]


class Hosts:
    "Hosts `names` (namespaces) on one bridge, addresses `SUBNET.1..`; a context manager that tears everything down."
    def __init__(self, names, tag: str | None = None):
        self.tag = tag or f'tsl3h{os.getpid() % 100000}'
        self.names = list(names)
        self.ns = {n: f'{self.tag}{n}' for n in self.names}
        self.addr = {n: f'{SUBNET}.{i + 1}' for i, n in enumerate(self.names)}
        self.port = {n: f'p{i}' for i, n in enumerate(self.names)}
        self.switch = f'{self.tag}sw'
        self.procs, self.made, self.caps, self.cut = [], [], {}, set()
        atexit.register(self.close)
        try: self._make()
        except BaseException: self.close(); raise

    def _make(self):
        _run('ip', 'netns', 'add', self.switch); self.made.append(self.switch)
        sw = ('ip', '-n', self.switch)
        _run(*sw, 'link', 'add', 'br0', 'type', 'bridge'); _run(*sw, 'link', 'set', 'br0', 'up')
        for n in self.names:
            ns = self.ns[n]
            _run('ip', 'netns', 'add', ns); self.made.append(ns)
            _run('ip', '-n', ns, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', self.port[n], 'netns', self.switch)
            _run(*sw, 'link', 'set', self.port[n], 'master', 'br0'); _run(*sw, 'link', 'set', self.port[n], 'up')
            _run('ip', '-n', ns, 'addr', 'add', f'{self.addr[n]}/24', 'dev', 'eth0')
            _run('ip', '-n', ns, 'link', 'set', 'eth0', 'up'); _run('ip', '-n', ns, 'link', 'set', 'lo', 'up')

    def __enter__(self): return self
    def __exit__(self, *exc): self.close()
    def __repr__(self): return f"Hosts({', '.join(f'{n}={a}' for n, a in self.addr.items())})"

    def cap(self, name: str, rate: str = '1gbit', burst: str = '256kb'):
        "A `tbf` rate cap on both directions of `name`'s link (replacing one set before)."
        for ns, dev in ((self.ns[name], 'eth0'), (self.switch, self.port[name])):
            _run('tc', '-n', ns, 'qdisc', 'replace', 'dev', dev, 'root', 'tbf', 'rate', rate, 'burst', burst, 'latency', '100ms')
        self.caps[name] = rate

    def uncap(self, name: str):
        for ns, dev in ((self.ns[name], 'eth0'), (self.switch, self.port[name])):
            _run('tc', '-n', ns, 'qdisc', 'del', 'dev', dev, 'root', check=False)
        self.caps.pop(name, None)

    def partition(self, a: str, b: str):
        "Drop every frame between hosts `a` and `b`, silently (both directions); other pairs keep talking."
        for x, y in ((a, b), (b, a)):
            _run('ip', '-n', self.ns[x], 'neigh', 'replace', self.addr[y], 'lladdr', BOGUS_MAC, 'nud', 'permanent', 'dev', 'eth0')
        self.cut.add((a, b))

    def isolate(self, a: str):
        "Set `a`'s link down: every peer partitioned from it."
        _run('ip', '-n', self.ns[a], 'link', 'set', 'eth0', 'down'); self.cut.add((a, None))

    def heal(self):
        "Undo every partition and isolation."
        for a, b in sorted(self.cut, key=str):
            if b is None:
                _run('ip', '-n', self.ns[a], 'link', 'set', 'eth0', 'up')
                _run('ip', '-n', self.ns[a], 'addr', 'replace', f'{self.addr[a]}/24', 'dev', 'eth0')
            else:
                for x, y in ((a, b), (b, a)):
                    _run('ip', '-n', self.ns[x], 'neigh', 'del', self.addr[y], 'dev', 'eth0', check=False)
        self.cut.clear()

    def spawn(self, name: str, argv, **popen) -> subprocess.Popen:
        "Start `argv` inside host `name`; killed by pid in `close()`."
        p = subprocess.Popen(['ip', 'netns', 'exec', self.ns[name], *argv], preexec_fn=_die_with_parent, **popen)
        self.procs.append(p)
        return p

    def kill(self, p: subprocess.Popen, timeout_s: float = 5.0):
        if p.poll() is None:
            p.kill()
            try: p.wait(timeout_s)
            except subprocess.TimeoutExpired: pass

    @property
    def pids(self): return [p.pid for p in self.procs if p.poll() is None]

    def close(self):
        "Kill every process spawned (by pid), then delete every namespace made (idempotent)."
        for p in self.procs: self.kill(p)
        for p in self.procs:
            for f in (p.stdin, p.stdout, p.stderr):
                try: f and f.close()
                except OSError: pass
        while self.made: _run('ip', 'netns', 'del', self.made.pop(), check=False)

    def exists(self) -> list[str]:
        "The namespaces of this fixture that still exist (none after `close`)."
        out = _run('ip', 'netns', 'list').stdout
        return [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0].startswith(self.tag)]
