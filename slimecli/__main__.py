from slimecli.cli.entry import main

main()
