from kvplan.cli.app import run

run()
