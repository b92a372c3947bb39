from mooncake_cli.app import main

main()
