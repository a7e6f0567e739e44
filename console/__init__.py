"""The developer console's domain (plain functions, no HTTP): its accounts, sessions and access
(`console.accounts`) and what it shows about an application (`console.views`). Its pages are
`handlers/console/`, which call these through `self.run`."""
