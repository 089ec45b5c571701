from mrt_fast.cli.process import main

main()
