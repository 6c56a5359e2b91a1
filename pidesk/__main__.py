from pidesk.cli.main import main

main()
