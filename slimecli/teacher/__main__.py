from slimecli.teacher.main import main

main()
