"""How kvops reaches hosts: the inventory as Ansible sees it (`inventory`), and the direct SSH
transport beside Ansible's (`ssh`: verified host keys, jump hosts, become; `ssh_cert`: host
certificates judged as ssh(1) judges them)."""
