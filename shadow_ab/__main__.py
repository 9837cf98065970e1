from shadow_ab.cli import main

main()
