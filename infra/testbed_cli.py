"""`python -m infra.testbed start|list|stop`: the test bed by hand (root). State lives under /tmp/ddpctl-testbed."""

from __future__ import annotations

import argparse
import sys

from infra import testbed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.testbed", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start a bed that lives until `stop`")
    start.add_argument("--hosts", type=int, default=2)
    start.add_argument("--ports", default="", help="comma-separated port per host (default 22 for all)")
    start.add_argument("--prefix", default="ddptb")
    start.add_argument("--host-python", action="store_true", help="give hosts this machine's python3 + torch")
    start.add_argument("--identical", action="store_true",
                       help="identical hosts (eth0, homes under /home); by default they differ as real machines do: "
                            "interface names, a docker0, homes, python paths")
    sub.add_parser("list", help="list beds")
    stop = sub.add_parser("stop", help="stop beds started by hand (and stale ones)")
    stop.add_argument("--bed", type=int, help="only this bed index")
    stop.add_argument("--all", action="store_true", help="also beds whose owner process is still alive")
    args = parser.parse_args(argv)

    if args.command == "start":
        ports = [int(p) for p in args.ports.split(",")] if args.ports else None
        bed = testbed.Testbed(args.prefix, n_hosts=args.hosts, ports=ports, persistent=True,
                              host_python=args.host_python, varied=not args.identical)
        print(f"test bed {bed.idx} (bridge {bed.state.bridge}, {bed.state.bridge_address}/24)")
        for host in bed.hosts:
            print(f"  {host.spec}  netns={host.netns} iface={host.iface} home={host.home}")
        print(f"client key:  {bed.client_key_path}")
        print(f"known_hosts: {bed.known_hosts_path}")
        print(f"try: ssh -i {bed.client_key_path} -o UserKnownHostsFile={bed.known_hosts_path} "
              f"-p {bed.hosts[0].port} {bed.hosts[0].user}@{bed.hosts[0].address}" if bed.hosts else "")
        return 0
    if args.command == "list":
        for bed_dir, state in testbed.list_beds():
            if state is None:
                print(f"{bed_dir}: no readable state")
                continue
            owner = "by hand" if state.owner_pid is None else (
                f"pid {state.owner_pid} ({'alive' if testbed.owner_alive(state) else 'dead'})")
            print(f"bed {state.idx} [{state.prefix}] {owner}: "
                  + ", ".join(f"{h['user']}@{h['address']}:{h['port']}" for h in state.hosts))
        return 0
    stopped = []
    for bed_dir, state in testbed.list_beds():
        if state is None or (args.bed is not None and state.idx != args.bed):
            continue
        if args.all or args.bed is not None or not testbed.owner_alive(state):
            testbed.stop_bed_dir(bed_dir)
            stopped.append(state.idx)
    print(f"stopped beds: {', '.join(map(str, stopped)) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
