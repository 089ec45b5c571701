from mrt_fast.cli import app

app()
