from grpo_lab.cli import main

main()
