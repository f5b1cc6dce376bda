from tilecast.cli import main

main()
