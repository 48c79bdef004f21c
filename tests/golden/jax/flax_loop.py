# args: --stages 3 --model Net
import flax.linen as nn
import jax.numpy as jnp


class Net(nn.Module):
    def setup(self):
        self.stem = nn.Dense(32)
        self.blocks = [nn.Dense(32) for _ in range(4)]
        self.head = nn.Dense(4)

    def __call__(self, x):
        x = self.stem(x)
        for block in self.blocks:  # four blocks
            x = jnp.tanh(block(x))
        return self.head(x)
# output:
# args: --stages 3 --model Net
import flax.linen as nn
import jax.numpy as jnp
import jax  # syncpass sync: imported for the transfers


class Net(nn.Module):
    def setup(self):
        self.stem = nn.Dense(32)
        self.blocks = [nn.Dense(32) for _ in range(4)]
        self.head = nn.Dense(4)

    def __call__(self, x):
        x = self.stem(x)
        for block in self.blocks[:1]:  # four blocks
            x = jnp.tanh(block(x))
        x = jax.device_put(x, jax.devices()[1])  # syncpass sync 1/2: 64 KiB, 346 us/step predicted
        for block in self.blocks[1:3]:  # four blocks
            x = jnp.tanh(block(x))
        x = jax.device_put(x, jax.devices()[2])  # syncpass sync 2/2: 64 KiB, 346 us/step predicted
        for block in self.blocks[3:]:  # four blocks
            x = jnp.tanh(block(x))
        return self.head(x)
