"""mmspec's toy image models, as data: `mmspec.zoo` finds them in this package's `models/` folder."""
