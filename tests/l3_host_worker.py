"""One process on one network host of tests/l3_hosts.py (started there by `ip netns exec`): a Mooncake store process
that mounts a segment, or an engine instance with an L3 tier, driven by JSON lines on stdin, answering JSON lines on
stdout. Every wait is bounded; stdin closing ends the process (its tier and store closed).

Commands: {"op": "store", master, host, segment_bytes} | {"op": "engine", master, host, seed, pages, timeout_s,
max_batch_pages} | {"op": "put"|"get"|"match", seed, n, wait_s} (a request of n full pages made from token seed `seed`;
put stores host pages at..at+n-1, get loads into them after zeroing them; {"error": ...} if any of them is still
held) | {"op": "hosts", seed, n} (per page the store host holding its object, or 0 absent) | {"op": "state"} (held
and quarantined pages, the tier's stats) | {"op": "release"} (the quarantine released: its pages) | {"op": "quit"}.
put/get answer {"submitted": ...} first, then the result:
codes, prefix, seconds to done, the caller's seconds, a sha256 per page, held and quarantined pages.
"""
import faulthandler, hashlib, json, sys, time


def say(**kw): print(json.dumps(kw), flush=True)


def client(master, host, deadline_s=30, **kw):
    "A MooncakeStore on this host, retried until the master answers (it may still be starting), at most `deadline_s`."
    from tokenspeed_lit.l3.store import MooncakeStore
    end = time.monotonic() + deadline_s
    while True:
        try: return MooncakeStore(master, local_hostname=host, connect_timeout_s=2.0, **kw)
        except (ConnectionError, RuntimeError):
            if time.monotonic() > end: raise
            time.sleep(0.2)


def tokens(seed, n):
    import torch
    return torch.randint(0, 50_000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def main():
    import numpy as np
    import torch
    tier = mirror = store = None
    page_size = 16
    for line in sys.stdin:
        cmd = json.loads(line); op = cmd['op']
        faulthandler.dump_traceback_later(40, exit=False)      # a command stuck this long shows where, in the log
        if op == 'quit': break
        if op == 'store':
            store = client(cmd['master'], cmd['host'], segment_bytes=cmd['segment_bytes'])
            say(ready=True); continue
        if op == 'engine':
            from tokenspeed_lit.tiers.kv_pool import PagedKVPool
            from tokenspeed_lit.tiers.host_mirror import FlatHostMirror
            from tokenspeed_lit.l3.keys import L3Namespace
            from tokenspeed_lit.l3.tier import L3Tier
            from tokenspeed_lit.core.streams import synchronize
            n = cmd['pages']
            pool = PagedKVPool(num_pages=n, page_size=page_size, num_layers=4, num_kv_heads=8, head_dim=64)
            mirror = FlatHostMirror(pool, num_host_pages=n)
            g = torch.Generator().manual_seed(cmd['seed'])
            for dt, _ in mirror.tensor_pairs:
                b = dt.view(torch.uint8); b.copy_(torch.randint(0, 256, b.shape, generator=g, dtype=torch.uint8))
            mirror.store_pages([(p, p) for p in range(n)]); synchronize()
            ns = L3Namespace('m@1', mirror, salt=b'hosts')
            tier = L3Tier(mirror, client(cmd['master'], cmd['host']), ns, timeout_s=cmd['timeout_s'],
                          probe_interval_s=cmd.get('probe_interval_s', 0.2),
                          max_batch_pages=cmd.get('max_batch_pages', 256))
            say(ready=True, page_bytes=int(mirror.host_pages[0].numel() * mirror.host_pages.element_size())); continue
        if op == 'release':
            say(released=[int(p) for p in tier.release_quarantine()]); continue
        if op == 'state':
            say(held=[int(p) for p in np.flatnonzero(tier.held())], quarantined=[int(p) for p in tier.quarantined()],
                stats={k: int(v) for k, v in tier.stats.items()}); continue
        n, wait_s, at = cmd['n'], cmd.get('wait_s', 30), cmd.get('at', 0)
        req, pages = tokens(cmd['seed'], page_size * n), np.arange(at, at + n)
        if op == 'hosts':                               # the store host holding each page's object (batch_hosts)
            say(hosts=tier.store.batch_hosts(tier.namespace.keys(req))); continue
        if op != 'match' and tier.held(pages).any():      # an abandoned call's pages stay held until the store returns
            say(error=f'host pages {[int(p) for p in pages[tier.held(pages)]]} still held'); continue
        t0 = time.monotonic()
        if op == 'put': h = tier.put_tokens(req, pages)
        elif op == 'match': h = tier.match(tier.namespace.keys(req))
        else:
            mirror.host_pages[at:at + n] = 0
            t0 = time.monotonic(); h = tier.get_tokens(req, pages)
        call_s = time.monotonic() - t0
        say(submitted=True, call_s=call_s)
        done = h.wait(wait_s); done_s = time.monotonic() - t0
        codes = [int(c) for c in h.codes]
        sha = [hashlib.sha256(mirror.host_pages[p].contiguous().numpy().tobytes()).hexdigest() for p in pages.tolist()] \
            if op != 'match' else []
        say(done=done, done_s=done_s, call_s=call_s, codes=codes, prefix=int(h.prefix), sha=sha,
            held=[int(p) for p in np.flatnonzero(tier.held())], quarantined=[int(p) for p in tier.quarantined()])
    if tier is not None: tier.close(5)
    if store is not None: store.close()


if __name__ == '__main__':
    main()
