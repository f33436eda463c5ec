from raybatch.cli.app import main

main()
