from slimecli.cli.app import main

main()
