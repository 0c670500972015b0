"""python -m hub up [--class-list CSV] | add-users CSV | start | stop | status | down [--purge]

Settings come from TAS_HUB_* variables (hub/settings.py); the defaults put the hub at http://localhost:8000.
"""
import argparse
import sys
from pathlib import Path

from hub import deploy
from hub.classlist import Accounts, parse_class_list
from hub.settings import HubSettings

DEMO_CLASS = Path(__file__).resolve().parent / "demo-class.csv"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hub", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="set up the class hub (accounts, environments, course, exchange) and start it")
    up.add_argument("--class-list", type=Path, default=DEMO_CLASS, help=f"CSV username,role[,name] (default: {DEMO_CLASS.name})")
    add = sub.add_parser("add-users", help="create the accounts of a class list (the hub need not restart)")
    add.add_argument("class_list", type=Path)
    sub.add_parser("start", help="start the hub again after `stop`")
    sub.add_parser("stop", help="stop the hub and every server; keeps accounts, submissions and grades")
    sub.add_parser("status", help="is the hub running, where, and who is in the class")
    down = sub.add_parser("down", help="stop the hub; with --purge remove everything `up` created")
    down.add_argument("--purge", action="store_true",
                      help="also delete the accounts the hub created (with their homes!), its groups, the course "
                           "copy with the gradebook, the exchange and the environments")
    args = parser.parse_args(argv)
    settings = HubSettings.from_env()
    try:
        if args.command == "up":
            deploy.up(settings, args.class_list)
        elif args.command == "add-users":
            members, bad = parse_class_list(args.class_list.read_text())
            for row in bad:
                print(f"{args.class_list}, {row}: skipped")
            accounts = Accounts(settings.state, settings.instructors_group, settings.students_group)
            accounts.ensure_groups()
            for member in members:
                new = accounts.add(member)
                print(f"{member.role:10} {member.username:24} {'new account' if new else 'existing account, added'}")
            print(f"passwords of new accounts: {accounts.passwords}")
        elif args.command == "start":
            deploy.start(settings)
            print(f"up: {settings.url}/hub/login")
        elif args.command == "stop":
            deploy.stop(settings)
        elif args.command == "status":
            pid = deploy.hub_pid(settings)
            print(f"JupyterHub: {'running, pid ' + str(pid) if pid else 'not running'} · {settings.url}/hub/login")
            if settings.state.exists():
                for user, info in sorted(Accounts(settings.state, settings.instructors_group,
                                                  settings.students_group).members().items()):
                    print(f"  {info['role']:10} {user}")
        elif args.command == "down":
            deploy.down(settings, purge=args.purge)
    except deploy.SetupError as exc:
        print(f"python -m hub {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
