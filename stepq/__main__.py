from stepq.cli import main

main()
