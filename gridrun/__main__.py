from gridrun.cli import main

main()
