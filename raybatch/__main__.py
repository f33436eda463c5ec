from raybatch.cli import main

main()
