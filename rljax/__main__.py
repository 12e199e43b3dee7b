from rljax.cli import main

main()
