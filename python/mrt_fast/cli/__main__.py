from mrt_fast.cli.app import app

app()
